//! A test that needs its own process environment (variables set or unset) runs its body in a
//! child process of this binary, the variables given to that child only. Writing the
//! environment of this process is unsafe: its other tests run on threads beside it and read it
//! (clap reads every setting's variable, the AWS SDK its endpoint and credentials).
//!
//! The test calls [`in_child`] first: in the child it runs its body and returns; in the parent it
//! calls [`run_alone`] with the variables and checks nothing else.

use std::process::Command;

/// Set in the child process only.
const CHILD: &str = "ENI_OPERATOR_TEST_CHILD";

/// Whether this process is a child started by [`run_alone`].
pub fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the test `test` of module `module` (`module_path!()` of the caller) alone, in a child
/// process of this test binary whose environment `configure` sets, and panics with its output
/// unless exactly that one test passed.
pub fn run_alone(module: &str, test: &str, configure: impl FnOnce(&mut Command)) {
    let name = test_path(module, test);
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args([name.as_str(), "--exact"]);
    configure(&mut cmd);
    let out = cmd.env(CHILD, "1").output().expect("run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a child process: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test's name as the harness filters it: its module path without the crate's name.
fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

#[test]
fn test_paths_drop_the_crate_name() {
    assert_eq!(test_path("it::config_env", "t"), "config_env::t");
    assert_eq!(test_path("it::a::b", "t"), "a::b::t");
    assert_eq!(test_path("it", "t"), "t");
    assert_eq!(
        test_path(module_path!(), "test_paths_drop_the_crate_name"),
        "support::child::test_paths_drop_the_crate_name"
    );
}
