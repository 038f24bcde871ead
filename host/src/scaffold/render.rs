//! The templates' small language: `{{var}}` is replaced by its value; `{{#flag}}...{{/flag}}` is
//! kept when `flag` is set, `{{^flag}}...{{/flag}}` when it is not (mustache's syntax, without
//! nesting of one flag in itself). A tag alone on its line takes the line with it, so templates
//! stay readable source files in their own language.
//!
//! Written here rather than taken from a template engine: the templates are ours and need
//! nothing more, and a test renders every one of them with every flag.

/// Why a template did not render: a bug in the template, which the tests catch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("{{{{#{0}}}}} or {{{{^{0}}}}} without its {{{{/{0}}}}}")]
    /// A `{{` without its `}}`.
    Unclosed(String),
    #[error("unknown variable {{{{{0}}}}}")]
    /// A placeholder the template has no value for.
    Unknown(String),
    #[error("a {{{{ without its }}}}")]
    /// A block without its end.
    Unterminated,
    #[error("not UTF-8 text")]
    /// A template that is not UTF-8 text.
    NotText,
}

/// Renders `template` with `vars` (name, value) and the set `flags`.
pub fn render(
    template: &str,
    vars: &[(&str, &str)],
    flags: &[(&str, bool)],
) -> Result<String, RenderError> {
    let mut text = standalone_tags(template);
    for (flag, on) in flags {
        text = section(&text, &format!("{{{{#{flag}}}}}"), flag, *on)?;
        text = section(&text, &format!("{{{{^{flag}}}}}"), flag, !*on)?;
    }
    substitute(&text, vars)
}

/// Removes the line breaks around section tags that stand alone on their lines.
fn standalone_tags(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    for line in template.split_inclusive('\n') {
        let tag = line.trim();
        let is_section = tag.starts_with("{{")
            && tag.ends_with("}}")
            && matches!(tag.as_bytes().get(2), Some(b'#' | b'^' | b'/'))
            && tag[2..].find("{{").is_none();
        out.push_str(if is_section { tag } else { line });
    }
    out
}

/// Keeps (`keep`) or drops every `open ... {{/flag}}` span.
fn section(text: &str, open: &str, flag: &str, keep: bool) -> Result<String, RenderError> {
    let close = format!("{{{{/{flag}}}}}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        out.push_str(&rest[..start]);
        let body = &rest[start + open.len()..];
        let end = body
            .find(&close)
            .ok_or_else(|| RenderError::Unclosed(flag.into()))?;
        if keep {
            out.push_str(&body[..end]);
        }
        rest = &body[end + close.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

fn substitute(text: &str, vars: &[(&str, &str)]) -> Result<String, RenderError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or(RenderError::Unterminated)?;
        let name = &after[..end];
        let value = vars
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| RenderError::Unknown(name.into()))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_and_sections_inline_and_standalone() {
        let t = "a {{name}}\n{{#pa}}\nwith {{name}}\n{{/pa}}\n{{^pa}}\nwithout\n{{/pa}}\nx{{#pa}}, y{{/pa}}.\n";
        let vars = [("name", "acme")];
        assert_eq!(
            render(t, &vars, &[("pa", true)]).unwrap(),
            "a acme\nwith acme\nx, y.\n"
        );
        assert_eq!(
            render(t, &vars, &[("pa", false)]).unwrap(),
            "a acme\nwithout\nx.\n"
        );
    }

    #[test]
    fn template_bugs_are_named() {
        assert_eq!(
            render("{{#pa}}x", &[], &[("pa", true)]),
            Err(RenderError::Unclosed("pa".into()))
        );
        assert_eq!(
            render("{{nope}}", &[("name", "a")], &[]),
            Err(RenderError::Unknown("nope".into()))
        );
        assert_eq!(render("{{name", &[], &[]), Err(RenderError::Unterminated));
        assert_eq!(
            RenderError::Unknown("x".into()).to_string(),
            "unknown variable {{x}}"
        );
    }
}
