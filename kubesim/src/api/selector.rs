//! Label and field selectors, parsed from query strings and matched against JSON objects.
//! Pure logic: no IO.
//!
//! The label selector grammar, its validation and its error texts follow the apiserver's
//! `k8s.io/apimachinery/pkg/labels` parser (so a bad selector is refused with the same 400
//! message); the field selector follows `k8s.io/apimachinery/pkg/fields` (terms split on
//! unescaped commas, `\\`, `\,` and `\=` escapes in values, no whitespace trimming).

use serde_json::{Map, Value};

/// A parsed `labelSelector` query parameter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    /// ANDed requirements, sorted by key as the real parser does.
    requirements: Vec<Requirement>,
}

/// One term of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    pub key: String,
    pub op: LabelOp,
    /// Sorted, deduplicated values (empty for Exists/DoesNotExist).
    pub values: Vec<String>,
}

/// Label selector operators (`gt`/`lt` are the `>`/`<` forms the real parser accepts too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelOp {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`. Errors are plain messages for a 400.
    pub fn parse(s: &str) -> Result<Self, String> {
        let tokens = lex(s);
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = p.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Whether an object's `metadata.labels` (None = no labels) satisfies the selector.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// True when the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// The single value a label must have to match (`k=v`, `k==v` or `k in (v)`), if the
    /// selector requires one; lets the server index watchers by label.
    pub fn equality(&self, key: &str) -> Option<&str> {
        let r = self.requirements.iter().find(|r| r.key == key)?;
        match (r.op, r.values.as_slice()) {
            (LabelOp::Equals | LabelOp::In, [v]) => Some(v),
            _ => None,
        }
    }
}

impl Requirement {
    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let value = labels.and_then(|l| l.get(&self.key)).map(label_text);
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.op {
            LabelOp::Equals | LabelOp::In => value.is_some_and(|v| has(&v)),
            LabelOp::NotEquals | LabelOp::NotIn => value.is_none_or(|v| !has(&v)),
            LabelOp::Exists => value.is_some(),
            LabelOp::DoesNotExist => value.is_none(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let Some(Ok(actual)) = value.map(|v| v.parse::<i64>()) else {
                    return false;
                };
                let Some(Ok(bound)) = self.values.first().map(|v| v.parse::<i64>()) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

fn label_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    End,
    Ident(String),
    /// `in` / `notin`: identifiers everywhere except in operator position.
    Keyword(String),
    Sym(&'static str),
}

impl Tok {
    fn literal(&self) -> &str {
        match self {
            Tok::End => "",
            Tok::Ident(s) | Tok::Keyword(s) => s,
            Tok::Sym(s) => s,
        }
    }
    /// The token as seen in a value or key position (keywords are plain identifiers there).
    fn ident(&self) -> Option<&str> {
        match self {
            Tok::Ident(s) | Tok::Keyword(s) => Some(s),
            _ => None,
        }
    }
}

const SYMBOLS: [&str; 9] = ["!=", "==", "!", "=", "(", ")", ",", ">", "<"];

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn lex(s: &str) -> Vec<Tok> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_ws(c) {
            i += 1;
        } else if is_special(c) {
            // Longest run of special characters that still spells a known symbol.
            let mut best: Option<&'static str> = None;
            let mut j = i;
            let mut buf = String::new();
            while j < chars.len() && is_special(chars[j]) {
                buf.push(chars[j]);
                match SYMBOLS.iter().find(|s| **s == buf) {
                    Some(sym) => best = Some(sym),
                    None if best.is_some() => break,
                    None => {}
                }
                j += 1;
            }
            // Every single special character is a symbol, so a match always exists.
            let sym = best.unwrap_or("=");
            i += sym.chars().count();
            out.push(Tok::Sym(sym));
        } else {
            let start = i;
            while i < chars.len() && !is_special(chars[i]) && !is_ws(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word == "in" || word == "notin" {
                out.push(Tok::Keyword(word));
            } else {
                out.push(Tok::Ident(word));
            }
        }
    }
    out.push(Tok::End);
    out
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }
    fn starts_requirement(t: &Tok) -> bool {
        t.ident().is_some() || *t == Tok::Sym("!")
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            let t = self.peek().clone();
            if Self::starts_requirement(&t) {
                let r = self
                    .requirement()
                    .map_err(|e| format!("unable to parse requirement: {e}"))?;
                reqs.push(r);
                match self.next() {
                    Tok::End => return Ok(reqs),
                    Tok::Sym(",") => {
                        let t2 = self.peek();
                        if !Self::starts_requirement(t2) {
                            return Err(format!(
                                "found '{}', expected: identifier after ','",
                                t2.literal()
                            ));
                        }
                    }
                    other => {
                        return Err(format!(
                            "found '{}', expected: ',' or 'end of string'",
                            other.literal()
                        ));
                    }
                }
            } else if t == Tok::End {
                return Ok(reqs);
            } else {
                return Err(format!(
                    "found '{}', expected: !, identifier, or 'end of string'",
                    t.literal()
                ));
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let mut t = self.next();
        let negated = t == Tok::Sym("!");
        if negated {
            t = self.next();
        }
        let Some(key) = t.ident().map(str::to_owned) else {
            return Err(format!("found '{}', expected: identifier", t.literal()));
        };
        if let Err(e) = validate_label_key(&key) {
            return Err(field_invalid("<nil>", &key, &e));
        }
        let at_end = matches!(self.peek(), Tok::End | Tok::Sym(","));
        if negated || at_end {
            let op = if negated {
                LabelOp::DoesNotExist
            } else {
                LabelOp::Exists
            };
            return Ok(Requirement {
                key,
                op,
                values: Vec::new(),
            });
        }
        let op_tok = self.next();
        let op = match &op_tok {
            Tok::Keyword(k) if k == "in" => LabelOp::In,
            Tok::Keyword(_) => LabelOp::NotIn,
            Tok::Sym("=") | Tok::Sym("==") => LabelOp::Equals,
            Tok::Sym("!=") => LabelOp::NotEquals,
            Tok::Sym(">") => LabelOp::GreaterThan,
            Tok::Sym("<") => LabelOp::LessThan,
            other => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                ));
            }
        };
        let mut values = match op {
            LabelOp::In | LabelOp::NotIn => self.value_set()?,
            _ => vec![self.exact_value()?],
        };
        values.sort();
        values.dedup();
        let mut errs = Vec::new();
        if matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) {
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(field_invalid(
                        &format!("values[{i}]"),
                        v,
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    ));
                }
            }
        }
        for (i, v) in values.iter().enumerate() {
            if let Err(e) = validate_label_value(v) {
                errs.push(field_invalid(&format!("values[{i}][{key}]"), v, &e));
            }
        }
        match errs.len() {
            0 => Ok(Requirement { key, op, values }),
            1 => Err(errs.remove(0)),
            _ => Err(format!("[{}]", errs.join(", "))),
        }
    }

    fn value_set(&mut self) -> Result<Vec<String>, String> {
        let t = self.next();
        if t != Tok::Sym("(") {
            return Err(format!("found '{}' expected: '('", t.literal()));
        }
        let first = self.peek().clone();
        if first == Tok::Sym(")") {
            self.next();
            return Ok(vec![String::new()]);
        }
        if first.ident().is_none() && first != Tok::Sym(",") {
            return Err(format!(
                "found '{}', expected: ',', ')' or identifier",
                first.literal()
            ));
        }
        let mut values = Vec::new();
        loop {
            let t = self.next();
            if let Some(v) = t.ident() {
                values.push(v.to_owned());
                match self.peek() {
                    Tok::Sym(",") => continue,
                    Tok::Sym(")") => break,
                    other => {
                        return Err(format!("found '{}', expected: ',' or ')'", other.literal()));
                    }
                }
            } else if t == Tok::Sym(",") {
                // Empty entries (`(,a)`, `(a,)`, `(a,,b)`) stand for the empty value.
                if values.is_empty() {
                    values.push(String::new());
                }
                match self.peek() {
                    Tok::Sym(")") => {
                        values.push(String::new());
                        break;
                    }
                    Tok::Sym(",") => {
                        self.next();
                        values.push(String::new());
                    }
                    _ => {}
                }
            } else {
                return Err(format!(
                    "found '{}', expected: ',', or identifier",
                    t.literal()
                ));
            }
        }
        let close = self.next();
        if close != Tok::Sym(")") {
            return Err(format!("found '{}', expected: ')'", first.literal()));
        }
        Ok(values)
    }

    fn exact_value(&mut self) -> Result<String, String> {
        if matches!(self.peek(), Tok::End | Tok::Sym(",")) {
            return Ok(String::new());
        }
        let t = self.next();
        match t.ident() {
            Some(v) => Ok(v.to_owned()),
            None => Err(format!("found '{}', expected: identifier", t.literal())),
        }
    }
}

/// `field.Invalid(...)` rendered as the apiserver renders it.
fn field_invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {value:?}: {detail}")
}

const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    })
}

/// `validation.IsQualifiedName`'s messages for `value` (`[prefix/]name`; empty when valid).
/// As in Go, an empty name part fails both the length and the pattern check.
pub(crate) fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs: Vec<String> = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".into());
                }
                if !is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {DNS1123_SUBDOMAIN_ERR}"));
                }
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_ERR} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".into());
    }
    if !is_qualified_name_part(name) {
        errs.push(format!("name part {QUALIFIED_NAME_ERR}"));
    }
    errs
}

/// A label key: `[prefix/]name`, as `validation.IsQualifiedName`. Errors joined by "; ".
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let errs = qualified_name_errors(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// A label value, as `validation.IsValidLabelValue`. Errors joined by "; ".
pub fn validate_label_value(v: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !v.is_empty() && !is_qualified_name_part(v) {
        errs.push(LABEL_VALUE_ERR.to_owned());
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// A parsed `fieldSelector` query parameter (`=`, `==`, `!=` on dotted paths).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    /// ANDed terms, sorted by their source text as the real parser does.
    terms: Vec<FieldTerm>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FieldTerm {
    pub field: String,
    /// `true` for `!=`.
    pub negated: bool,
    /// Unescaped value.
    pub value: String,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = split_terms(s);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((field, op, raw)) = split_term(part) else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            terms.push(FieldTerm {
                field: field.to_owned(),
                negated: op == "!=",
                value: unescape_value(raw)?,
            });
        }
        Ok(Self { terms })
    }

    /// The field paths the selector names (so the server can refuse unsupported ones).
    pub fn fields(&self) -> Vec<&str> {
        self.terms.iter().map(|t| t.field.as_str()).collect()
    }

    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }

    /// Whether the whole object satisfies the selector. A missing field reads as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            let actual = field_value(obj, &t.field);
            (actual == t.value) != t.negated
        })
    }

    /// The value of a `field=value` (or `==`) term, used to index watchers.
    pub fn equality(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.negated)
            .map(|t| t.value.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// A field of `obj` by dotted path rendered as the apiserver's field sets render it:
/// strings as-is, booleans and numbers in their text form, absent or null as "". An Event's
/// `source` is its source component (or reporting controller), as its registry selects it.
pub fn field_value(obj: &Value, path: &str) -> String {
    if path == "source"
        && let Some(source) = super::events::selectable_source(obj)
    {
        return source;
    }
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null | Value::Array(_) | Value::Object(_) => String::new(),
    }
}

/// Splits on commas not escaped by a backslash (escapes stay in the terms).
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// The first operator occurrence splits the term; `!=` and `==` are tried before `=`.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], op, value));
            }
        }
    }
    None
}

fn unescape_value(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                other => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{other}"
                    ));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // The real error prints the rune with %v, i.e. as its code point number.
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    c as u32
                ));
            }
            other => out.push(other),
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn equality_forms() {
        let l = labels(json!({"app": "web", "tier": "front"}));
        assert!(sel("app=web").matches(Some(&l)));
        assert!(sel("app==web").matches(Some(&l)));
        assert!(!sel("app=db").matches(Some(&l)));
        assert!(sel("app!=db").matches(Some(&l)));
        assert!(!sel("app!=web").matches(Some(&l)));
        assert!(sel("missing!=x").matches(Some(&l)));
        assert!(!sel("missing=x").matches(Some(&l)));
        assert!(sel("app=web,tier=front").matches(Some(&l)));
        assert!(!sel("app=web,tier=back").matches(Some(&l)));
    }

    #[test]
    fn set_forms_and_existence() {
        let l = labels(json!({"env": "prod", "flag": ""}));
        assert!(sel("env in (prod,dev)").matches(Some(&l)));
        assert!(!sel("env in (dev)").matches(Some(&l)));
        assert!(sel("env notin (dev)").matches(Some(&l)));
        assert!(!sel("env notin (prod, dev)").matches(Some(&l)));
        assert!(sel("other notin (x)").matches(Some(&l)));
        assert!(!sel("other in (x)").matches(Some(&l)));
        assert!(sel("env").matches(Some(&l)));
        assert!(sel("flag").matches(Some(&l)));
        assert!(!sel("!flag").matches(Some(&l)));
        assert!(sel("!other").matches(Some(&l)));
        assert!(sel("flag=").matches(Some(&l)));
        assert!(sel("flag in ()").matches(Some(&l)));
        assert!(sel("flag in (a,)").matches(Some(&l)));
        assert!(!sel("env in (a,)").matches(Some(&l)));
        assert!(!sel("other").matches(None));
        assert!(sel("!other").matches(None));
        assert!(sel("x notin (y)").matches(None));
    }

    #[test]
    fn whitespace_keywords_and_order() {
        let s = sel("  env   in ( prod , dev ) ,  !gone , in = notin ");
        assert_eq!(s.requirements().len(), 3);
        // sorted by key like the real parser
        let keys: Vec<_> = s.requirements().iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["env", "gone", "in"]);
        let l = labels(json!({"env": "dev", "in": "notin"}));
        assert!(s.matches(Some(&l)));
        assert_eq!(s.requirements()[0].values, ["dev", "prod"]);
    }

    #[test]
    fn prefixed_keys() {
        let key = "member.local-activator.dev/0123abcd4567ef89";
        let s = sel(key);
        assert!(s.matches(Some(&labels(json!({key: ""})))));
        assert!(!s.matches(Some(&labels(
            json!({"member.local-activator.dev/ffff": ""})
        ))));
        assert!(
            sel("app.kubernetes.io/name=local-activator,app.kubernetes.io/component=activator")
                .matches(Some(&labels(json!({
                    "app.kubernetes.io/name": "local-activator",
                    "app.kubernetes.io/component": "activator"
                }))))
        );
    }

    #[test]
    fn gt_lt() {
        let l = labels(json!({"n": "5", "s": "x"}));
        assert!(sel("n>3").matches(Some(&l)));
        assert!(!sel("n>5").matches(Some(&l)));
        assert!(sel("n<6").matches(Some(&l)));
        assert!(!sel("s>1").matches(Some(&l)));
        assert!(!sel("m<1").matches(Some(&l)));
        let e = LabelSelector::parse("n>x").unwrap_err();
        assert!(e.contains("the value must be an integer"), "{e}");
    }

    #[test]
    fn empty_selector() {
        let s = sel("");
        assert!(s.is_empty());
        assert!(s.matches(None));
        assert!(sel("   ").is_empty());
        assert!(!sel("a").is_empty());
    }

    #[test]
    fn equality_lookup() {
        let s = sel("a=1,b in (2),c in (3,4),d!=5");
        assert_eq!(s.equality("a"), Some("1"));
        assert_eq!(s.equality("b"), Some("2"));
        assert_eq!(s.equality("c"), None);
        assert_eq!(s.equality("d"), None);
        assert_eq!(s.equality("z"), None);
    }

    #[test]
    fn errors_mirror_the_apiserver() {
        let cases = [
            ("a=b=c", "found '=', expected: ',' or 'end of string'"),
            ("a,", "found '', expected: identifier after ','"),
            ("a,,b", "found ',', expected: identifier after ','"),
            (
                ",a",
                "found ',', expected: !, identifier, or 'end of string'",
            ),
            (
                "a in b",
                "unable to parse requirement: found 'b' expected: '('",
            ),
            (
                "a in (b",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
            (
                "!",
                "unable to parse requirement: found '', expected: identifier",
            ),
            (
                "a=(",
                "unable to parse requirement: found '(', expected: identifier",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(LabelSelector::parse(input).unwrap_err(), want, "{input}");
        }
    }

    #[test]
    fn key_and_value_validation() {
        let e = LabelSelector::parse("-a=b").unwrap_err();
        assert!(
            e.starts_with("unable to parse requirement: <nil>: Invalid value: \"-a\": name part must consist of"),
            "{e}"
        );
        let e = LabelSelector::parse("Bad_Prefix/a").unwrap_err();
        assert!(
            e.contains("prefix part a lowercase RFC 1123 subdomain"),
            "{e}"
        );
        let e = LabelSelector::parse("a/b/c").unwrap_err();
        assert!(e.contains("a qualified name must consist of"), "{e}");
        let long = "x".repeat(64);
        let e = LabelSelector::parse(&long).unwrap_err();
        assert!(
            e.contains("name part must be no more than 63 characters"),
            "{e}"
        );
        let e = LabelSelector::parse(&format!("a={long}")).unwrap_err();
        assert!(
            e.starts_with(&format!("unable to parse requirement: values[0][a]: Invalid value: \"{long}\": must be no more than 63 characters")),
            "{e}"
        );
        let e = LabelSelector::parse("a=b@").unwrap_err();
        assert!(e.contains("a valid label must be an empty string"), "{e}");
        let e = LabelSelector::parse("a in (-x,y-)").unwrap_err();
        assert!(
            e.starts_with("unable to parse requirement: [values[0][a]"),
            "{e}"
        );
        assert!(sel(&format!("a={}", "x".repeat(63))).requirements()[0].values[0].len() == 63);
        assert!(sel("a=A-b_c.9").matches(Some(&labels(json!({"a": "A-b_c.9"})))));
        assert!(LabelSelector::parse("a=_x").is_err());
    }

    #[test]
    fn field_selector_basics() {
        let pod = json!({
            "metadata": {"name": "p1", "namespace": "ns"},
            "spec": {"nodeName": "n1", "hostNetwork": false},
            "status": {"phase": "Running"}
        });
        let unbound = json!({"metadata": {"name": "p2"}, "spec": {}});
        let f = FieldSelector::parse("spec.nodeName=n1").unwrap();
        assert!(f.matches(&pod));
        assert!(!f.matches(&unbound));
        assert_eq!(f.equality("spec.nodeName"), Some("n1"));
        assert_eq!(f.fields(), ["spec.nodeName"]);
        let f = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(f.matches(&unbound));
        assert!(!f.matches(&pod));
        let f = FieldSelector::parse("spec.nodeName!=").unwrap();
        assert!(f.matches(&pod));
        assert_eq!(f.equality("spec.nodeName"), None);
        let f = FieldSelector::parse("status.phase==Running,metadata.name!=p2").unwrap();
        assert!(f.matches(&pod));
        assert_eq!(f.fields(), ["metadata.name", "status.phase"]);
        let f = FieldSelector::parse("metadata.namespace=ns,spec.hostNetwork=false").unwrap();
        assert!(f.matches(&pod));
        assert!(
            !FieldSelector::parse("status.phase=Pending")
                .unwrap()
                .matches(&pod)
        );
        assert!(FieldSelector::parse("").unwrap().is_empty());
        assert!(FieldSelector::parse(",").unwrap().is_empty());
        assert!(!FieldSelector::parse("a=b").unwrap().is_empty());
    }

    #[test]
    fn field_selector_escapes_and_errors() {
        let f = FieldSelector::parse(r"metadata.name=a\,b\=c\\d").unwrap();
        assert_eq!(f.equality("metadata.name"), Some(r"a,b=c\d"));
        assert!(f.matches(&json!({"metadata": {"name": r"a,b=c\d"}})));
        assert_eq!(
            FieldSelector::parse("metadata.name").unwrap_err(),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        assert_eq!(
            FieldSelector::parse("a=b=c").unwrap_err(),
            "invalid field selector: unescaped character in value: 61"
        );
        assert_eq!(
            FieldSelector::parse(r"a=b\x").unwrap_err(),
            r"invalid field selector: invalid escape sequence: \x"
        );
        assert_eq!(
            FieldSelector::parse(r"a=b\").unwrap_err(),
            r"invalid field selector: invalid escape sequence: \"
        );
        // `!=` wins over `=` at the same position; `==` leaves no '=' in the value.
        let f = FieldSelector::parse("a!=b").unwrap();
        assert!(f.terms()[0].negated);
        let f = FieldSelector::parse("a==b").unwrap();
        assert_eq!(f.terms()[0].value, "b");
    }
}
