//! The entry points the CLI calls: recognise a description, read it, report on it.
//!
//! A description is a TOML file with a top-level `[paper]` table (format: crate docs); a
//! vramlab training config never has one.

pub use crate::config::{PaperConfig, is_paper_config};
pub use crate::report::{Report, report};
