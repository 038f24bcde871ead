//! The documentation as tests read it: README.md and the book under docs/src, and the blocks of
//! a page between `<!-- NAME:begin -->` and `<!-- NAME:end -->` that tests hold against the code
//! (the config reference, the metrics table, the command line, the catalogue's example entries).

use std::path::{Path, PathBuf};

/// The book's sources, relative to the repository.
pub const BOOK_SRC: &str = "docs/src";

/// The text of `rel`, a path relative to the repository (`docs/src/reference/metrics.md`).
pub fn read(rel: &str) -> String {
    let path = crate::repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every page of the book (each `.md` under docs/src), relative to the repository,
/// in a stable order.
pub fn pages() -> Vec<PathBuf> {
    let root = crate::repo();
    let mut pages = vec![PathBuf::from("README.md")];
    let mut dirs = vec![root.join(BOOK_SRC)];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(relative(&root, &path));
            }
        }
    }
    pages.sort();
    pages
}

fn relative(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root)
        .expect("a page of the repository")
        .to_path_buf()
}

/// The text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, or `None` when `text` has no
/// such pair in that order.
pub fn marked<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let (_, rest) = text.split_once(&begin)?;
    let (block, _) = rest.split_once(&end)?;
    Some(block)
}

/// `text` with the block `name` replaced by `new`, or `None` when it has no such block.
pub fn replace_marked(text: &str, name: &str, new: &str) -> Option<String> {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    Some(format!("{}{new}{}", &text[..start], &text[stop..]))
}

/// The block `name` of page `rel`, failing the test with what is missing.
pub fn block(rel: &str, name: &str) -> String {
    marked(&read(rel), name)
        .unwrap_or_else(|| {
            panic!("{rel} has no <!-- {name}:begin --> ... <!-- {name}:end --> block")
        })
        .to_string()
}
