//! The book (docs/src, built by `make book` with mdbook) and README.md hold together: every
//! relative link reaches a file and every `#anchor` a heading of its page, as GitHub and mdBook
//! name headings; every page is in SUMMARY.md; and the command-line reference is what `wdp`
//! prints for `--help` (`WDP_WRITE_GENERATED=1` rewrites it after a change to the CLI). The config
//! reference is checked against the parser by the host's unit tests, the metrics reference
//! against a running host by `observability`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use wdp_tests::book::{self, BOOK_SRC};

/// Pages outside the book whose links are checked with it: they link into it.
const LINKED_PAGES: &[&str] = &["CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md"];

/// What a page offers and asks for: its headings' anchors and its links (the line of each).
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<(usize, String)>,
}

fn parse(text: &str) -> Page {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    for (event, range) in Parser::new_ext(text, Options::ENABLE_TABLES).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let slug = slug(&heading.take().unwrap_or_default());
                let n = seen.entry(slug.clone()).or_default();
                anchors.insert(if *n == 0 {
                    slug.clone()
                } else {
                    format!("{slug}-{n}")
                });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                let line = text[..range.start].matches('\n').count() + 1;
                links.push((line, dest_url.to_string()));
            }
            _ => {}
        }
    }
    Page { anchors, links }
}

/// A heading's anchor as GitHub and mdBook make it: lower case, letters, digits, `-` and `_`
/// kept, each space a `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .flat_map(|c| {
            let keep: Vec<char> = if c.is_alphanumeric() || c == '-' || c == '_' {
                c.to_lowercase().collect()
            } else if c.is_whitespace() {
                vec!['-']
            } else {
                Vec::new()
            };
            keep
        })
        .collect()
}

/// `rel` joined to `dir` with `..` taken away lexically, as a browser resolves a relative link.
fn resolve(dir: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in dir.join(rel).components() {
        match part {
            Component::ParentDir => {
                if out.file_name().is_some() {
                    out.pop();
                } else {
                    // Above the repository: kept, so that the caller sees it.
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The page `rel` of the repository, parsed once.
fn load<'a>(parsed: &'a mut BTreeMap<PathBuf, Page>, root: &Path, rel: &Path) -> Option<&'a Page> {
    if !parsed.contains_key(rel) {
        let text = std::fs::read_to_string(root.join(rel)).ok()?;
        parsed.insert(rel.to_path_buf(), parse(&text));
    }
    parsed.get(rel)
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = wdp_tests::repo();
    let mut pages = book::pages();
    pages.extend(LINKED_PAGES.iter().map(PathBuf::from));
    let mut parsed: BTreeMap<PathBuf, Page> = BTreeMap::new();
    let mut broken = Vec::new();
    for page in &pages {
        let links = load(&mut parsed, &root, page)
            .expect("a page")
            .links
            .clone();
        let dir = page.parent().unwrap_or(Path::new(""));
        for (line, link) in links {
            // Addresses with a scheme (https:, mailto:) are not the repository's.
            if link
                .split(['/', '#'])
                .next()
                .is_some_and(|first| first.contains(':'))
            {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                resolve(dir, path)
            };
            if target.starts_with("..") || !root.join(&target).exists() {
                broken.push(format!(
                    "{}:{line}: {link}: no file {}",
                    page.display(),
                    target.display()
                ));
                continue;
            }
            if anchor.is_empty() || target.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let anchors = &load(&mut parsed, &root, &target)
                .expect("a page that exists")
                .anchors;
            if !anchors.contains(anchor) {
                broken.push(format!(
                    "{}:{line}: {link}: {} has no heading #{anchor}",
                    page.display(),
                    target.display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links ({}):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_summary_lists_every_page_of_the_book() {
    let summary_path = format!("{BOOK_SRC}/SUMMARY.md");
    let listed: BTreeSet<PathBuf> = parse(&book::read(&summary_path))
        .links
        .into_iter()
        .map(|(_, link)| Path::new(BOOK_SRC).join(link))
        .collect();
    let pages: BTreeSet<PathBuf> = book::pages()
        .into_iter()
        .filter(|p| p.starts_with(BOOK_SRC) && !p.ends_with("SUMMARY.md"))
        .collect();
    let unlisted: Vec<_> = pages.difference(&listed).collect();
    let missing: Vec<_> = listed.difference(&pages).collect();
    assert!(
        unlisted.is_empty() && missing.is_empty(),
        "{summary_path}: pages it does not list (mdbook would not render them): {unlisted:?}; \
         entries with no page: {missing:?}"
    );
}

#[test]
fn the_heading_slug_is_githubs() {
    assert_eq!(
        slug("`wdp scan --from-snapshot FILE`"),
        "wdp-scan---from-snapshot-file"
    );
    assert_eq!(
        slug("Changing the config of a running host (hot reload)"),
        "changing-the-config-of-a-running-host-hot-reload"
    );
    assert_eq!(
        slug("Real-cluster e2e: `make e2e`"),
        "real-cluster-e2e-make-e2e"
    );
    let page = parse("# A\n\n## A\n\n```sh\n# not a heading\n```\n[x](#a-1)\n");
    assert_eq!(
        page.anchors,
        BTreeSet::from(["a".to_string(), "a-1".to_string()])
    );
    assert_eq!(page.links, vec![(8, "#a-1".to_string())]);
}

/// The page of the command-line reference.
const CLI_PAGE: &str = "docs/src/reference/cli.md";

/// What `wdp ARGS --help` prints, at the width the reference is written for.
fn help(args: &[&str]) -> String {
    let out = Command::new(wdp_tests::wdp_bin())
        .args(args)
        .arg("--help")
        .env("COLUMNS", "100")
        .output()
        .expect("run wdp --help");
    assert!(out.status.success(), "wdp {args:?} --help: {out:?}");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands `wdp --help` lists, `help` aside.
fn subcommands(top: &str) -> Vec<String> {
    top.split_once("Commands:\n")
        .map(|(_, rest)| rest.split("\n\n").next().unwrap_or_default())
        .unwrap_or_default()
        .lines()
        // A name is indented by two spaces; its description's wrapped lines by more.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect()
}

/// The block of the reference for `wdp` and each subcommand, as it should read.
fn cli_block(help: &str) -> String {
    format!("\n```text\n{help}```\n")
}

#[test]
fn the_cli_reference_is_what_wdp_help_prints() {
    let top = help(&[]);
    let mut wanted = vec![("cli-wdp".to_string(), cli_block(&top))];
    for sub in subcommands(&top) {
        wanted.push((format!("cli-wdp-{sub}"), cli_block(&help(&[&sub]))));
    }
    assert!(wanted.len() > 5, "wdp --help lists its subcommands: {top}");

    let mut page = book::read(CLI_PAGE);
    if std::env::var_os("WDP_WRITE_GENERATED").is_some() {
        for (name, block) in &wanted {
            page = book::replace_marked(&page, name, block).unwrap_or_else(|| {
                panic!("{CLI_PAGE}: add <!-- {name}:begin --><!-- {name}:end --> where it goes")
            });
        }
        std::fs::write(wdp_tests::repo().join(CLI_PAGE), &page).expect("write the reference");
        return;
    }
    for (name, block) in &wanted {
        assert!(
            book::marked(&page, name) == Some(block.as_str()),
            "{CLI_PAGE}: the block {name} is not what `wdp --help` prints now: run \
             `WDP_WRITE_GENERATED=1 cargo test -p wdp-tests --test integration -- book::` \
             (it should read:{block})"
        );
    }
    // No block for a subcommand that is gone.
    let names: BTreeSet<&str> = wanted.iter().map(|(n, _)| n.as_str()).collect();
    let stale: Vec<&str> = page
        .match_indices("<!-- cli-wdp")
        .filter_map(|(at, _)| page[at + 5..].split(':').next())
        .filter(|name| !names.contains(name))
        .collect();
    assert!(
        stale.is_empty(),
        "{CLI_PAGE}: blocks of no subcommand: {stale:?}"
    );
}

/// Units a measured figure carries in the docs (`1.3 ms`, `16.2 MiB`, `1.20x`).
const UNITS: &[&str] = &["ms", "µs", "s", "min", "MiB", "KiB", "MB", "GB", "x"];

/// The figures of `sentence`: a number and its unit, as written (`23.4 ms`, `1.20x`).
fn figures(sentence: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = sentence.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '.'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && (chars[j].is_ascii_digit() || chars[j] == '.' || chars[j] == ',') {
            j += 1;
        }
        let number: String = chars[i..j].iter().collect();
        let number = number.trim_end_matches(['.', ',']);
        let gap = usize::from(chars.get(j) == Some(&' '));
        let mut k = j + gap;
        while k < chars.len() && chars[k].is_alphabetic() {
            k += 1;
        }
        let unit: String = chars[j + gap..k].iter().collect();
        let ends = chars.get(k).is_none_or(|c| !c.is_alphanumeric());
        if ends && UNITS.contains(&unit.as_str()) {
            out.push(format!("{number}{}{unit}", if gap == 1 { " " } else { "" }));
        }
        i = k.max(j);
    }
    out
}

/// The paragraphs, list items and table rows of a page, each on one line.
fn blocks(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let item = line.trim_start();
        let starts = item.is_empty()
            || item.starts_with('|')
            || item.starts_with("* ")
            || item.starts_with("- ");
        if starts && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(item);
    }
    out.push(current);
    out
}

/// Measured figures live in bench/RESULTS.md (`make bench` writes it, with bench/NOTES.md
/// appended); the docs link them. A sentence that names RESULTS.md and quotes a figure must
/// quote one the file holds, so a figure cannot be quoted with one value there and another here.
#[test]
fn figures_quoted_from_the_results_are_the_results() {
    let results = book::read("bench/RESULTS.md");
    let notes = book::read("bench/NOTES.md");
    let mut stale = Vec::new();
    for page in book::pages() {
        let text = book::read(&page.to_string_lossy());
        for block in blocks(&text) {
            for sentence in block.split(". ").filter(|s| s.contains("RESULTS.md")) {
                for figure in figures(sentence) {
                    if !results.contains(&figure) && !notes.contains(&figure) {
                        stale.push(format!("{}: {figure} in \"{sentence}\"", page.display()));
                    }
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "figures quoted from bench/RESULTS.md that it does not hold (link the figure instead of \
         quoting it):\n{}",
        stale.join("\n")
    );
}

#[test]
fn figures_are_read_with_their_units() {
    assert_eq!(
        figures("took 23.4 ms median and 1.20x, 16.2 MiB, 4 min 24 s, v1.34, 2x2, 128Mi"),
        ["23.4 ms", "1.20x", "16.2 MiB", "4 min", "24 s"]
    );
}
