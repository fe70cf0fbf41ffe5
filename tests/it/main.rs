//! The integration tests of `eni-operator`: one test binary (`cargo test --test it`), one module
//! per topic. One binary links the library once instead of once per file, which was most of the
//! time `cargo test` spent after a change to `src/`.
//!
//! Run one topic with its module path: `cargo test --test it chart::`, one test with its full
//! name: `cargo test --test it chart::the_chart_version_is_the_crates -- --exact`.
//!
//! All modules share one process: a test that needs its own environment variables runs its body
//! in a child process (`support::child`) instead of writing this process's environment, and an
//! executable a test writes is written by a child process (`e2e_scripts::fake`), so that no fork
//! of another test holds it open. `layout` keeps every test file a module of this binary.

mod support;

mod contract;

mod agent_admission;
mod agent_update_race;
mod chart;
mod cilium_ignore_policy;
mod cluster_name;
mod config_env;
mod dependencies;
mod docs;
mod e2e_scripts;
mod ec2_contract;
mod ec2_moto;
mod ec2_sim_wire;
mod eventual_consistency;
mod fencing;
mod flags_doc;
mod handover;
mod instance_identity;
mod layout;
mod lease_guard;
mod limits_flags;
mod manifests;
mod metrics_compat;
mod monitoring;
mod multi_card;
mod node_name_reuse;
mod node_status;
mod release;
mod runtime_core;
mod runtime_moto;
mod shadow;
mod source_watch;
mod standby;
mod static_ip;
