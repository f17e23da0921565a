//! Label and field selectors, parsed from the strings clients send (`?labelSelector=`,
//! `?fieldSelector=`) and matched against objects.

pub mod field;
pub mod label;
