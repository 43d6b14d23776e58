//! The local-activator Revisions shown in the docs (```yaml blocks and `<<'EOF'` heredocs)
//! are valid: they parse as `crds::Revision`, pass its own checks, and their template parses
//! as a PodTemplateSpec whose containers have a name and an image. A reader who copies one
//! gets an object the API server and the activator accept.

use k8s_openapi::api::core::v1::PodTemplateSpec;

const DOCS: [&str; 3] = ["installation.md", "comparison.md", "operations.md"];

/// The YAML documents of ```yaml blocks and of `<<'EOF'` heredocs in `text`.
fn snippets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<(String, &str)> = None;
    for line in text.lines() {
        match &mut cur {
            None if line.trim_start().starts_with("```yaml") => cur = Some((String::new(), "```")),
            None if line.contains("<<'EOF'") => cur = Some((String::new(), "EOF")),
            None => {}
            Some((buf, end)) => {
                if line.trim() == *end {
                    out.push(std::mem::take(buf));
                    cur = None;
                } else {
                    buf.push_str(line);
                    buf.push('\n');
                }
            }
        }
    }
    out
}

/// The problems of the Revisions in one doc's snippets, and how many it had.
fn check(doc: &str, text: &str) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut problems = Vec::new();
    for s in snippets(text) {
        if !(s.contains("apiVersion: local-activator.dev/v1alpha1") && s.contains("kind: Revision"))
        {
            continue;
        }
        n += 1;
        let rev: crds::Revision = match serde_saphyr::from_str(&s) {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("{doc}: {e}\n{s}"));
                continue;
            }
        };
        problems.extend(rev.problems().into_iter().map(|p| format!("{doc}: {p}")));
        match serde_json::from_str::<PodTemplateSpec>(rev.spec.template.json()) {
            Ok(t) => {
                let containers = t.spec.map(|s| s.containers).unwrap_or_default();
                if containers.is_empty() {
                    problems.push(format!("{doc}: the template has no container"));
                }
                for c in containers {
                    if c.name.is_empty() || c.image.is_none() {
                        problems.push(format!("{doc}: a container without a name or image"));
                    }
                }
            }
            Err(e) => problems.push(format!("{doc}: the template is not a PodTemplateSpec: {e}")),
        }
    }
    (n, problems)
}

#[test]
fn the_revisions_in_the_docs_are_valid() {
    let mut total = 0;
    let mut problems = Vec::new();
    for doc in DOCS {
        let path = format!("{}/../docs/{doc}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let (n, p) = check(doc, &text);
        total += n;
        problems.extend(p);
    }
    assert!(total >= 2, "only {total} Revisions found in the docs");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_invalid_revision_in_a_doc_is_caught() {
    let doc = "\
```yaml
apiVersion: local-activator.dev/v1alpha1
kind: Revision
metadata: { name: a }
spec:
  port: 70000
  maxScale: 1
  minScale: 2
  template: { spec: { containers: [ { image: x } ] } }
```
";
    let (n, p) = check("test", doc);
    assert_eq!(n, 1);
    // The port, maxScale < minScale, and a container without a name.
    assert!(p.len() >= 3, "{p:#?}");
}
