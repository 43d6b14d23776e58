//! loadtest (see DESIGN.md).
