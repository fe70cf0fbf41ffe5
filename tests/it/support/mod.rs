pub mod child;
pub mod moto;
pub mod settings;
