//! subsetter (see DESIGN.md).
