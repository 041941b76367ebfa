//! Connect protocol codec (sans-IO).
pub fn x(){}
