//! The `dst` binary's contract with `make dst`: the summary line and the exit status.

use std::process::Command;

#[test]
fn one_seed_ends_with_the_summary_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_dst"))
        .args(["--seed", "1"])
        .output()
        .expect("the dst binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().last() == Some("dst: 1 seeds, 0 violations"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("trace hash"), "{stdout}");
    assert!(out.status.success());
}
