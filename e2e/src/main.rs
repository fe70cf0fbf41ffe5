mod agent;
fn main() {}
