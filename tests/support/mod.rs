pub mod moto;
pub mod world;
