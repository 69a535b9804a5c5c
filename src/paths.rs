//! Repository-relative paths as the product reads them, whatever tree they name (a commit's
//! `Snapshot`, Bosun's checkout, a Kargo step's work tree): one normal form, and whether a path
//! leaves the tree. Pure string work: nothing here touches the disk or runs git.

/// Normalises a repository path: no leading `./` or `/`, no trailing `/`, `a/./b` -> `a/b`.
/// `..` segments are resolved; a path that climbs out of the repository keeps its `..` so that
/// it never matches a file (callers check [`escapes_root`]).
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

/// True when a repository-relative path leaves the repository.
pub fn escapes_root(path: &str) -> bool {
    normalize(path).split('/').next() == Some("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_paths() {
        assert_eq!(normalize("./a/b/"), "a/b");
        assert_eq!(normalize("a/../b"), "b");
        assert_eq!(normalize("/a//b"), "a/b");
        assert!(escapes_root("../x"));
        assert!(escapes_root("a/../../x"));
        assert!(!escapes_root("a/../x"));
    }
}
