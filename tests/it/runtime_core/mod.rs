//! The allocation core without Kubernetes: the simulator behind the gate, a `MemorySink` as the
//! API server, paused tokio time.
//!
//! One module per topic; the helpers they share are in `support`.

mod deletion;
mod ec2_view;
mod events;
mod ignore;
mod input;
mod leader;
mod leadership;
mod load;
mod lost_answers;
mod multi_pool;
mod refresher;
mod release;
mod support;
mod tokens;
