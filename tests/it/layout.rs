//! The integration tests stay one binary and lose no file: every `.rs` file under `tests/` is a
//! module of `tests/it/main.rs`. A file beside it would be a binary of its own, linking the
//! library once more; a file under it that no `mod` names would never be compiled or run.

use std::path::{Path, PathBuf};

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// Every `.rs` file below `dir`, relative to `tests/`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(tests_dir()).unwrap().to_path_buf());
        }
    }
}

/// The module a file declares and the files that may declare it (`a/b.rs` is `mod b;` of
/// `a/mod.rs`, `a/main.rs` or `a.rs`; `a/b/mod.rs` is `mod b;` of the same).
fn declared_by(file: &Path) -> (String, Vec<PathBuf>) {
    let stem = file.file_stem().unwrap().to_string_lossy();
    let dir = file.parent().unwrap();
    let (name, dir) = if stem == "mod" {
        (
            dir.file_name().unwrap().to_string_lossy(),
            dir.parent().unwrap(),
        )
    } else {
        (stem, dir)
    };
    let mut parents = vec![dir.join("mod.rs"), dir.join("main.rs")];
    if let Some(up) = dir.parent() {
        parents.push(up.join(format!("{}.rs", dir.file_name().unwrap().to_string_lossy())));
    }
    (name.into_owned(), parents)
}

fn declares(text: &str, module: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim();
        let line = line.strip_prefix("pub ").unwrap_or(line);
        line == format!("mod {module};")
    })
}

/// The files under `tests/` that are not a module of the one binary, with what to do.
fn strays(files: &[PathBuf], read: impl Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        if file == Path::new("it/main.rs") {
            continue;
        }
        if !file.starts_with("it") {
            found.push(format!(
                "tests/{}: a test binary of its own; move it into tests/it/ (git mv) and add its \
                 `mod` to tests/it/main.rs",
                file.display()
            ));
            continue;
        }
        let (module, parents) = declared_by(file);
        if !parents
            .iter()
            .any(|p| read(p).is_some_and(|text| declares(&text, &module)))
        {
            found.push(format!(
                "tests/{}: no `mod {module};` names it, so it never runs",
                file.display()
            ));
        }
    }
    found
}

#[test]
fn every_test_file_is_a_module_of_the_one_binary() {
    let mut files = Vec::new();
    rust_files(&tests_dir(), &mut files);
    assert!(
        files.iter().any(|f| f == Path::new("it/layout.rs")),
        "the walk found {files:?}"
    );
    let stray = strays(&files, |p| {
        std::fs::read_to_string(tests_dir().join(p)).ok()
    });
    assert!(stray.is_empty(), "{}", stray.join("\n"));
}

#[test]
fn a_file_beside_the_binary_or_never_declared_is_found() {
    let files: Vec<PathBuf> = [
        "it/main.rs",
        "it/a.rs",
        "it/b.rs",
        "it/d/mod.rs",
        "it/d/x.rs",
        "new.rs",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let read = |p: &Path| match p.to_str().unwrap() {
        "it/main.rs" => Some("mod a;\npub mod d;\n".to_owned()),
        "it/d/mod.rs" => Some("mod y;\n".to_owned()),
        _ => None,
    };
    let found = strays(&files, read);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("tests/it/b.rs: no `mod b;`"));
    assert!(found[1].starts_with("tests/it/d/x.rs: no `mod x;`"));
    assert!(found[2].starts_with("tests/new.rs: a test binary of its own"));
}
