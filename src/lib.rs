//! The product library: the gate's render engine and verdict, the observer and Bosun.
pub mod bosun;
pub mod forge;
pub mod gate;
pub mod observer;
pub mod render;
pub mod schema;
pub mod yaml;
