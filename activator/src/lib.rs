//! activator (see DESIGN.md).
