//! Pure helpers of Kubernetes' object model that every part of a shard needs: the store key
//! layout, name validation, label and field selectors, and resource quantities. No I/O.

pub mod keys;
pub mod names;
pub mod quantity;
pub mod selector;
pub mod time;

pub use quantity::{Quantity, QuantityError};
pub use selector::field::{FieldSelector, FieldSelectorError};
pub use selector::label::{LabelSelector, LabelSelectorError};
