//! Tests of schema handling against the apiserver's observable behaviour.

use serde_json::{Value, json};

use super::errors::go_float;
use super::{CompiledSchema, FieldCause, invalid_message};

/// A schema shaped like the project's Revision, plus a few fields exercising the other keywords.
fn revision_schema() -> Value {
    json!({
        "type": "object",
        "required": ["spec"],
        "x-kubernetes-validations": [
            {"rule": "self.metadata.name.size() <= 63", "message": "metadata.name must be no more than 63 characters"}
        ],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["template"],
                "x-kubernetes-validations": [
                    {"rule": "self.maxScale == 0 || self.maxScale >= self.minScale", "message": "maxScale must be >= minScale"}
                ],
                "properties": {
                    "port": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535, "default": 8080},
                    "minScale": {"type": "integer", "format": "int32", "minimum": 0, "default": 0},
                    "maxScale": {"type": "integer", "format": "int32", "minimum": 0, "default": 0},
                    "activators": {"type": "integer", "nullable": true, "minimum": 1},
                    "ratio": {"type": "number", "maximum": 1000000},
                    "hosts": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 10}, "default": []},
                    "tags": {"type": "array", "minItems": 1, "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "mode": {"type": "string", "enum": ["fast", "slow"]},
                    "name": {"type": "string", "minLength": 3, "pattern": "^[a-z]+$"},
                    "since": {"type": "string", "format": "date-time"},
                    "target": {"x-kubernetes-int-or-string": true},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "options": {
                        "type": "object",
                        "default": {},
                        "properties": {
                            "retries": {"type": "integer", "default": 3},
                            "backoff": {"type": "string"}
                        }
                    },
                    "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "embedded": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}
                }
            },
            "status": {
                "type": "object",
                "nullable": true,
                "properties": {
                    "observedGeneration": {"type": "integer", "nullable": true},
                    "conditions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type", "status"],
                            "properties": {"type": {"type": "string"}, "status": {"type": "string"}}
                        }
                    }
                }
            }
        }
    })
}

fn compiled() -> CompiledSchema {
    CompiledSchema::compile(&revision_schema()).expect("the schema compiles")
}

fn revision(spec: Value) -> Value {
    json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": spec
    })
}

/// Defaults and prunes like the apiserver does before validating, then validates.
fn check(mut obj: Value) -> Vec<FieldCause> {
    let schema = compiled();
    schema.default_and_prune(&mut obj);
    schema.validate(&obj, None)
}

fn cause(reason: &str, field: &str, message: &str) -> FieldCause {
    FieldCause {
        reason: reason.into(),
        field: field.into(),
        message: message.into(),
    }
}

fn not_checked() -> FieldCause {
    cause(
        "FieldValueInvalid",
        "<nil>",
        "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
    )
}

#[test]
fn defaults_fill_missing_fields_of_present_objects() {
    let schema = compiled();
    let mut obj = revision(json!({"template": {"spec": {}}, "minScale": 2}));
    let pruned = schema.default_and_prune(&mut obj);
    assert!(pruned.is_empty());
    let spec = &obj["spec"];
    assert_eq!(spec["port"], json!(8080));
    assert_eq!(spec["minScale"], json!(2), "a sent value is kept");
    assert_eq!(spec["maxScale"], json!(0));
    assert_eq!(spec["hosts"], json!([]));
    // `options` is defaulted to {} and then its own fields are defaulted inside it.
    assert_eq!(spec["options"], json!({"retries": 3}));
    assert!(
        obj.get("status").is_none(),
        "absent objects without a default stay absent"
    );
    assert!(schema.validate(&obj, None).is_empty());
}

#[test]
fn nulls_take_defaults_or_disappear_unless_nullable() {
    let schema = compiled();
    let mut obj = revision(json!({"template": {}, "port": null, "mode": null, "activators": null}));
    obj["status"] = Value::Null;
    schema.default_and_prune(&mut obj);
    assert_eq!(obj["spec"]["port"], json!(8080));
    assert!(obj["spec"].get("mode").is_none());
    assert_eq!(obj["spec"]["activators"], Value::Null);
    assert_eq!(obj["status"], Value::Null);
    assert!(schema.validate(&obj, None).is_empty());
}

#[test]
fn pruning_drops_unknown_fields_and_reports_their_paths() {
    let schema = compiled();
    let mut obj = revision(json!({
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"image": "x"}]}},
        "foo": 1,
        "options": {"retries": 2, "bogus": true},
        "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "junk": 1}, "spec": {"x": 1}}
    }));
    obj["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "extra": "x"}]});
    obj["unknownTop"] = json!("x");
    obj["metadata"]["junk"] = json!("y");
    let pruned = schema.default_and_prune(&mut obj);
    assert_eq!(
        pruned,
        vec![
            "spec.foo",
            "spec.options.bogus",
            "status.conditions[0].extra",
            "unknownTop",
            "metadata.junk",
            "spec.embedded.metadata.junk",
        ]
    );
    assert!(obj["spec"].get("foo").is_none());
    assert!(obj.get("unknownTop").is_none());
    assert!(obj["metadata"].get("junk").is_none());
    assert_eq!(obj["metadata"]["namespace"], json!("default"));
    assert_eq!(obj["apiVersion"], json!("local-activator.dev/v1alpha1"));
    assert_eq!(obj["kind"], json!("Revision"));
    // x-kubernetes-preserve-unknown-fields keeps everything below it.
    assert_eq!(
        obj["spec"]["template"]["spec"]["containers"][0]["image"],
        json!("x")
    );
    assert_eq!(obj["spec"]["embedded"]["spec"]["x"], json!(1));
    assert_eq!(obj["spec"]["embedded"]["metadata"]["name"], json!("p"));
    assert_eq!(
        obj["status"]["conditions"][0],
        json!({"type": "Ready", "status": "True"})
    );
}

#[test]
fn integral_floats_are_stored_as_integers() {
    let schema = compiled();
    let mut obj = revision(json!({"template": {}, "port": 3.0, "ratio": 2.5}));
    schema.default_and_prune(&mut obj);
    assert_eq!(obj["spec"]["port"].to_string(), "3");
    assert_eq!(obj["spec"]["ratio"].to_string(), "2.5");
    assert!(schema.validate(&obj, None).is_empty());
}

#[test]
fn wrong_type_is_type_invalid_and_suppresses_cel() {
    let errs = check(revision(json!({"template": {}, "port": "string"})));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueTypeInvalid",
                "spec.port",
                "Invalid value: \"string\": spec.port in body must be of type integer: \"string\""
            ),
            not_checked(),
        ]
    );
}

#[test]
fn integer_field_rejects_fractional_number() {
    // With a format, kube-openapi reports the format and the Go type of the value.
    let errs = check(revision(json!({"template": {}, "port": 80.5})));
    assert_eq!(
        errs[0],
        cause(
            "FieldValueTypeInvalid",
            "spec.port",
            "Invalid value: \"float64\": spec.port in body must be of type int32: \"float64\""
        )
    );
    let errs = check(revision(
        json!({"template": {}, "options": {"retries": 2.5}}),
    ));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueTypeInvalid",
                "spec.options.retries",
                "Invalid value: \"number\": spec.options.retries in body must be of type integer: \"number\""
            ),
            not_checked(),
        ]
    );
}

#[test]
fn missing_required_field() {
    let errs = check(revision(json!({"port": 80})));
    assert_eq!(
        errs,
        vec![
            cause("FieldValueRequired", "spec.template", "Required value"),
            not_checked()
        ]
    );
    let mut obj = revision(json!({}));
    obj.as_object_mut().map(|m| m.remove("spec"));
    assert_eq!(
        check(obj),
        vec![
            cause("FieldValueRequired", "spec", "Required value"),
            not_checked()
        ]
    );
}

#[test]
fn range_errors_do_not_block_cel() {
    let errs = check(revision(
        json!({"template": {}, "port": 70000, "minScale": 5, "maxScale": 2}),
    ));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueInvalid",
                "spec.port",
                "Invalid value: 70000: spec.port in body should be less than or equal to 65535"
            ),
            cause(
                "FieldValueInvalid",
                "spec",
                "Invalid value: \"object\": maxScale must be >= minScale"
            ),
        ]
    );
    let errs = check(revision(json!({"template": {}, "minScale": -1})));
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec.minScale",
            "Invalid value: -1: spec.minScale in body should be greater than or equal to 0"
        )]
    );
    let errs = check(revision(json!({"template": {}, "ratio": 2000000.5})));
    assert_eq!(
        errs[0].message,
        "Invalid value: 2.0000005e+06: spec.ratio in body should be less than or equal to 1e+06"
    );
}

#[test]
fn string_constraints() {
    let errs = check(revision(json!({"template": {}, "mode": "medium"})));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueNotSupported",
                "spec.mode",
                "Unsupported value: \"medium\": supported values: \"fast\", \"slow\""
            ),
            not_checked(),
        ]
    );
    let errs = check(revision(
        json!({"template": {}, "hosts": ["a.example.com"]}),
    ));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueTooLong",
                "spec.hosts[0]",
                "Too long: may not be longer than 10"
            ),
            not_checked()
        ]
    );
    let errs = check(revision(json!({"template": {}, "name": "ab"})));
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec.name",
            "Invalid value: \"ab\": spec.name in body should be at least 3 chars long"
        )]
    );
    let errs = check(revision(json!({"template": {}, "name": "abC"})));
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec.name",
            "Invalid value: \"abC\": spec.name in body should match '^[a-z]+$'"
        )]
    );
    let errs = check(revision(json!({"template": {}, "since": "yesterday"})));
    assert_eq!(
        errs[0],
        cause(
            "FieldValueTypeInvalid",
            "spec.since",
            "Invalid value: \"yesterday\": spec.since in body must be of type date-time: \"yesterday\""
        )
    );
    assert!(
        check(revision(
            json!({"template": {}, "since": "2026-01-02T03:04:05Z"})
        ))
        .is_empty()
    );
}

#[test]
fn list_constraints() {
    let errs = check(revision(
        json!({"template": {}, "hosts": ["a", "b", "c", "d"]}),
    ));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueTooMany",
                "spec.hosts",
                "Too many: 4: must have at most 3 items"
            ),
            not_checked()
        ]
    );
    let errs = check(revision(json!({"template": {}, "tags": []})));
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec.tags",
            "Invalid value: 0: spec.tags in body should have at least 1 items"
        )]
    );
    let errs = check(revision(json!({"template": {}, "tags": ["x", "y", "x"]})));
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueDuplicate",
            "spec.tags[2]",
            "Duplicate value: \"x\""
        )]
    );
    let errs = check(revision(json!({"template": {}, "hosts": ["a", 5]})));
    assert_eq!(
        errs[0],
        cause(
            "FieldValueTypeInvalid",
            "spec.hosts[1]",
            "Invalid value: \"integer\": spec.hosts[1] in body must be of type string: \"integer\""
        )
    );
}

#[test]
fn maps_int_or_string_nullable_and_embedded() {
    let errs = check(revision(
        json!({"template": {}, "labels": {"a": "x", "b": 1}}),
    ));
    assert_eq!(
        errs[0],
        cause(
            "FieldValueTypeInvalid",
            "spec.labels.b",
            "Invalid value: \"integer\": spec.labels.b in body must be of type string: \"integer\""
        )
    );
    assert!(check(revision(json!({"template": {}, "target": 5}))).is_empty());
    assert!(check(revision(json!({"template": {}, "target": "50%"}))).is_empty());
    let errs = check(revision(json!({"template": {}, "target": true})));
    assert_eq!(
        errs[0],
        cause(
            "FieldValueTypeInvalid",
            "spec.target",
            "Invalid value: \"boolean\": spec.target in body must be of type integer,string: \"boolean\""
        )
    );
    let mut obj = revision(json!({"template": {}}));
    obj["status"] = json!({"observedGeneration": null});
    assert!(check(obj).is_empty(), "nullable fields accept null");
    let errs = check(revision(
        json!({"template": {}, "embedded": {"apiVersion": "v1"}}),
    ));
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueRequired",
                "spec.embedded.kind",
                "Required value: must not be empty"
            ),
            not_checked(),
        ]
    );
}

#[test]
fn cel_rule_passes_and_fails_with_its_message() {
    assert!(
        check(revision(
            json!({"template": {}, "minScale": 1, "maxScale": 3})
        ))
        .is_empty()
    );
    assert!(
        check(revision(json!({"template": {}, "minScale": 5}))).is_empty(),
        "maxScale 0 means unlimited"
    );
    let errs = check(revision(
        json!({"template": {}, "minScale": 5, "maxScale": 2}),
    ));
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec",
            "Invalid value: \"object\": maxScale must be >= minScale"
        )]
    );
}

#[test]
fn root_rule_sees_only_name_and_generate_name() {
    let mut obj = revision(json!({"template": {}}));
    obj["metadata"]["name"] = json!("x".repeat(64));
    assert_eq!(
        check(obj),
        vec![cause(
            "FieldValueInvalid",
            "<nil>",
            "Invalid value: \"object\": metadata.name must be no more than 63 characters"
        )]
    );
    let schema = CompiledSchema::compile(&json!({
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "!has(self.metadata.namespace) && !has(self.metadata.labels)"},
            {"rule": "self.metadata.generateName == 'gen-'"}
        ]
    }))
    .unwrap();
    let obj = json!({"metadata": {"name": "a", "generateName": "gen-", "namespace": "ns", "labels": {"a": "b"}}});
    assert!(schema.validate(&obj, None).is_empty());
}

#[test]
fn rule_without_message_reports_the_rule() {
    let schema = CompiledSchema::compile(&json!({
        "type": "object",
        "properties": {"spec": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.a < self.b"}]
        }}
    }))
    .unwrap();
    let errs = schema.validate(&json!({"spec": {"a": 2, "b": 1}}), None);
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec",
            "Invalid value: \"object\": failed rule: self.a < self.b"
        )]
    );
    // A field the object does not have is an evaluation error, not a pass.
    let errs = schema.validate(&json!({"spec": {"a": 2}}), None);
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec",
            "Invalid value: \"object\": no such key: b evaluating rule: self.a < self.b"
        )]
    );
}

#[test]
fn rule_options_message_expression_reason_and_field_path() {
    let schema = CompiledSchema::compile(&json!({
        "type": "object",
        "properties": {"spec": {
            "type": "object",
            "properties": {"replicas": {"type": "integer"}, "name": {"type": "string"}},
            "x-kubernetes-validations": [
                {"rule": "self.replicas < 10", "messageExpression": "'replicas is ' + string(self.replicas)"},
                {"rule": "self.name != 'root'", "message": "root is reserved", "reason": "FieldValueForbidden", "fieldPath": ".name"},
                {"rule": "self.name.matches('^[a-z]+$') && self.name.startsWith('r')", "message": "  lower case  "}
            ]
        }}
    }))
    .unwrap();
    let errs = schema.validate(&json!({"spec": {"replicas": 12, "name": "root"}}), None);
    assert_eq!(
        errs,
        vec![
            cause(
                "FieldValueInvalid",
                "spec",
                "Invalid value: \"object\": replicas is 12"
            ),
            cause(
                "FieldValueForbidden",
                "spec.name",
                "Forbidden: root is reserved"
            ),
        ]
    );
    let errs = schema.validate(&json!({"spec": {"replicas": 1, "name": "Rx"}}), None);
    assert_eq!(
        errs,
        vec![cause(
            "FieldValueInvalid",
            "spec",
            "Invalid value: \"object\": lower case"
        )]
    );
}

#[test]
fn rules_on_scalars_lists_and_maps() {
    let schema = CompiledSchema::compile(&json!({
        "type": "object",
        "properties": {"spec": {
            "type": "object",
            "properties": {
                "hosts": {
                    "type": "array",
                    "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self.endsWith('.dev')"}]},
                    "x-kubernetes-validations": [{"rule": "self.all(h, size(h) < 20) && self.isSorted()"}]
                },
                "weights": {
                    "type": "object",
                    "additionalProperties": {"type": "number", "x-kubernetes-validations": [{"rule": "self <= 1.0"}]},
                    "x-kubernetes-validations": [{"rule": "self.exists(k, k == 'main')", "message": "needs main"}]
                }
            }
        }}
    }))
    .unwrap();
    let ok = json!({"spec": {"hosts": ["a.dev", "b.dev"], "weights": {"main": 1, "x": 0.5}}});
    assert!(schema.validate(&ok, None).is_empty());
    let bad = json!({"spec": {"hosts": ["b.dev", "a.com"], "weights": {"x": 2}}});
    assert_eq!(
        schema.validate(&bad, None),
        vec![
            cause(
                "FieldValueInvalid",
                "spec.hosts",
                "Invalid value: \"array\": failed rule: self.all(h, size(h) < 20) && self.isSorted()"
            ),
            cause(
                "FieldValueInvalid",
                "spec.hosts[1]",
                "Invalid value: \"string\": failed rule: self.endsWith('.dev')"
            ),
            cause(
                "FieldValueInvalid",
                "spec.weights",
                "Invalid value: \"object\": needs main"
            ),
            cause(
                "FieldValueInvalid",
                "spec.weights[x]",
                "Invalid value: \"number\": failed rule: self <= 1.0"
            ),
        ]
    );
}

#[test]
fn transition_rules_run_only_on_update() {
    let schema = CompiledSchema::compile(&json!({
        "type": "object",
        "properties": {"spec": {
            "type": "object",
            "properties": {"port": {"type": "integer", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "port is immutable"}
            ]}},
            "x-kubernetes-validations": [{"rule": "!has(oldSelf.port) || has(self.port)", "message": "port cannot be removed"}]
        }}
    }))
    .unwrap();
    let new = json!({"spec": {"port": 81}});
    assert!(schema.validate(&new, None).is_empty(), "skipped on create");
    assert!(
        schema
            .validate(&new, Some(&json!({"spec": {"port": 81}})))
            .is_empty()
    );
    assert_eq!(
        schema.validate(&new, Some(&json!({"spec": {"port": 80}}))),
        vec![cause(
            "FieldValueInvalid",
            "spec.port",
            "Invalid value: \"integer\": port is immutable"
        )]
    );
    // The old object had no port: the field-level transition rule has nothing to compare with.
    assert!(schema.validate(&new, Some(&json!({"spec": {}}))).is_empty());
    assert_eq!(
        schema.validate(&json!({"spec": {}}), Some(&json!({"spec": {"port": 80}}))),
        vec![cause(
            "FieldValueInvalid",
            "spec",
            "Invalid value: \"object\": port cannot be removed"
        )]
    );
}

#[test]
fn bad_rules_fail_compilation_naming_them() {
    let bad = json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "x-kubernetes-validations": [
            {"rule": "self.a == 1"},
            {"rule": "self.a >"}
        ]}}
    });
    let err = CompiledSchema::compile(&bad).unwrap_err();
    assert!(
        err.starts_with(
            "openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule: Invalid value: apiextensions.ValidationRule{Rule:\"self.a >\""
        ),
        "{err}"
    );
    assert!(
        err.contains("compilation failed: ERROR: <input>:1:"),
        "{err}"
    );
    let cause =
        CompiledSchema::compile_at(&bad, "spec.versions[0].schema.openAPIV3Schema").unwrap_err();
    assert_eq!(
        cause.field,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].rule"
    );
    let bad_reason =
        json!({"type": "object", "x-kubernetes-validations": [{"rule": "true", "reason": "Nope"}]});
    let err = CompiledSchema::compile(&bad_reason).unwrap_err();
    assert_eq!(
        err,
        "openAPIV3Schema.x-kubernetes-validations[0].reason: Unsupported value: \"Nope\": supported values: \"FieldValueInvalid\", \"FieldValueForbidden\", \"FieldValueRequired\", \"FieldValueDuplicate\""
    );
    assert!(CompiledSchema::compile(&json!({"type": "thing"})).is_err());
    assert!(CompiledSchema::compile(&json!({"type": "string", "pattern": "("})).is_err());
}

#[test]
fn invalid_message_matches_the_apiserver() {
    let one = [cause(
        "FieldValueInvalid",
        "spec",
        "Invalid value: \"object\": maxScale must be >= minScale",
    )];
    assert_eq!(
        invalid_message("Revision.local-activator.dev", "bad", &one),
        "Revision.local-activator.dev \"bad\" is invalid: spec: Invalid value: \"object\": maxScale must be >= minScale"
    );
    let errs = check(revision(
        json!({"template": {}, "port": 70000, "minScale": -1}),
    ));
    assert_eq!(
        invalid_message("Revision.local-activator.dev", "bad", &errs),
        "Revision.local-activator.dev \"bad\" is invalid: [spec.minScale: Invalid value: -1: spec.minScale in body should be greater than or equal to 0, spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535]"
    );
    let twice = [one[0].clone(), one[0].clone()];
    assert_eq!(
        invalid_message("Revision.local-activator.dev", "bad", &twice),
        invalid_message("Revision.local-activator.dev", "bad", &one)
    );
    assert_eq!(
        invalid_message("Revision.local-activator.dev", "bad", &[]),
        "Revision.local-activator.dev \"bad\" is invalid"
    );
}

#[test]
fn go_float_formatting() {
    assert_eq!(go_float(65535.0), "65535");
    assert_eq!(go_float(1.5), "1.5");
    assert_eq!(go_float(1_000_000.0), "1e+06");
    assert_eq!(go_float(1_234_567.0), "1.234567e+06");
    assert_eq!(go_float(0.00001), "1e-05");
    assert_eq!(go_float(0.0001), "0.0001");
    assert_eq!(go_float(-3.0), "-3");
}

/// The generated CRDs in deploy/crds compile, and their Revision schema behaves as the contract
/// says.
#[test]
fn generated_crds_compile_and_validate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let mut revision_schema = None;
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/crds exists") {
        let path = entry.unwrap().path();
        // kustomize's file lists the CRDs; it is not one.
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.ends_with("kustomization.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let crd: Value = serde_saphyr::from_str(&text).expect("valid YAML");
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let schema = CompiledSchema::compile(&version["schema"]["openAPIV3Schema"])
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            count += 1;
            if crd["spec"]["names"]["kind"] == "Revision" {
                revision_schema = Some(schema);
            }
        }
    }
    assert!(count >= 2, "both CRDs found");
    let schema = revision_schema.expect("the Revision CRD");
    let mut ok = revision(json!({"template": {"spec": {"containers": [{"image": "app"}]}}}));
    schema.default_and_prune(&mut ok);
    assert_eq!(ok["spec"]["port"], json!(8080));
    assert!(
        schema.validate(&ok, None).is_empty(),
        "{:?}",
        schema.validate(&ok, None)
    );
    let mut bad = revision(json!({"template": {}, "minScale": 3, "maxScale": 1}));
    schema.default_and_prune(&mut bad);
    let errs = schema.validate(&bad, None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec");
    assert!(
        errs[0]
            .message
            .starts_with("Invalid value: \"object\": maxScale must be >= minScale")
    );
    let mut bad_port = revision(json!({"template": {}, "port": 0}));
    schema.default_and_prune(&mut bad_port);
    assert_eq!(
        schema.validate(&bad_port, None),
        vec![cause(
            "FieldValueInvalid",
            "spec.port",
            "Invalid value: 0: spec.port in body should be greater than or equal to 1"
        )]
    );
}

#[test]
fn compiled_schema_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
    let schema = compiled();
    assert_send_sync(&schema);
    let shared = std::sync::Arc::new(schema);
    let handle = {
        let shared = std::sync::Arc::clone(&shared);
        std::thread::spawn(move || {
            check_with(
                &shared,
                revision(json!({"template": {}, "minScale": 2, "maxScale": 1})),
            )
        })
    };
    let errs = handle.join().unwrap();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "spec");
}

fn check_with(schema: &CompiledSchema, mut obj: Value) -> Vec<FieldCause> {
    schema.default_and_prune(&mut obj);
    schema.validate(&obj, None)
}

#[test]
fn list_and_map_types_are_checked_as_crd_validation_does() {
    let list = |extra: Value, items: Value| {
        let mut members = json!({"type": "array", "items": items});
        for (k, v) in extra.as_object().unwrap() {
            members[k] = v.clone();
        }
        json!({"type": "object", "properties": {"members": members}})
    };
    let item = json!({"type": "object", "required": ["node"], "properties": {
        "node": {"type": "string"}, "w": {"type": "integer"}}});
    let err = |schema: Value| CompiledSchema::compile(&schema).unwrap_err();
    let keyed = json!({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["node"]});
    assert!(CompiledSchema::compile(&list(keyed.clone(), item.clone())).is_ok());
    assert_eq!(
        err(list(json!({"x-kubernetes-list-type": "map"}), item.clone())),
        "openAPIV3Schema.properties[members].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"
    );
    assert_eq!(
        err(list(
            json!({"x-kubernetes-list-map-keys": ["node"]}),
            item.clone()
        )),
        "openAPIV3Schema.properties[members].x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty"
    );
    assert_eq!(
        err(list(
            json!({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["nope"]}),
            item.clone()
        )),
        "openAPIV3Schema.properties[members].x-kubernetes-list-map-keys: Invalid value: []string{\"nope\"}: entries must all be names of item properties"
    );
    assert_eq!(
        err(list(
            json!({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["w"]}),
            item.clone()
        )),
        "openAPIV3Schema.properties[members].items.properties[w].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"
    );
    assert_eq!(
        err(list(keyed, json!({"type": "string"}))),
        "openAPIV3Schema.properties[members].items.type: Invalid value: \"string\": must be object if parent array's x-kubernetes-list-type is map"
    );
    assert_eq!(
        err(list(json!({"x-kubernetes-list-type": "bag"}), item.clone())),
        "openAPIV3Schema.properties[members].x-kubernetes-list-type: Unsupported value: \"bag\": supported values: \"atomic\", \"set\", \"map\""
    );
    assert_eq!(
        err(list(json!({"x-kubernetes-list-type": "set"}), item)),
        "openAPIV3Schema.properties[members].items.x-kubernetes-map-type: Invalid value: \"null\": must be atomic as item of a list with x-kubernetes-list-type=set"
    );
    assert_eq!(
        err(json!({"type": "string", "x-kubernetes-map-type": "atomic"})),
        "openAPIV3Schema.type: Invalid value: \"string\": must be object if x-kubernetes-map-type is specified"
    );
    assert_eq!(
        err(json!({"type": "object", "x-kubernetes-map-type": "loose"})),
        "openAPIV3Schema.x-kubernetes-map-type: Unsupported value: \"loose\": supported values: \"atomic\", \"granular\""
    );
}
