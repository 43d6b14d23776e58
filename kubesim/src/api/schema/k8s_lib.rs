//! The Kubernetes CEL libraries CRD rules use beyond the CEL standard library: lists
//! (`isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`) and regex (`find`, `findAll`).

use std::cmp::Ordering;
use std::sync::Arc;

use cel::common::types::{DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError, Value};

pub(crate) fn extension(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    env.add_member_overload("find", "string_find", STRING_TYPE, vec![STRING_TYPE], find)?;
    env.add_member_overload(
        "findAll",
        "string_find_all",
        STRING_TYPE,
        vec![STRING_TYPE],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_n",
        STRING_TYPE,
        vec![STRING_TYPE, INT_TYPE],
        find_all_n,
    )?;
    Ok(())
}

fn values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter()
        .map(|a| Value::try_from(a.as_ref() as &dyn Val))
        .collect()
}

fn list_arg(v: &Value, function: &str) -> Result<Arc<Vec<Value>>, ExecutionError> {
    match v {
        Value::List(l) => Ok(Arc::clone(l)),
        other => Err(ExecutionError::function_error(
            function,
            format!("expected a list, got {:?}", other.type_of()),
        )),
    }
}

fn ret<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let boxed: Box<dyn Val> = v.try_into()?;
    Ok(CowVal::from(boxed))
}

fn compare(a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    a.partial_cmp(b).ok_or_else(|| {
        ExecutionError::no_such_overload(
            "_<_",
            vec![format!("{:?}", a.type_of()), format!("{:?}", b.type_of())],
        )
    })
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let list = list_arg(&args[0], "isSorted")?;
    for pair in list.windows(2) {
        if compare(&pair[0], &pair[1])? == Ordering::Greater {
            return ret(Value::Bool(false));
        }
    }
    ret(Value::Bool(true))
}

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let list = list_arg(&args[0], "sum")?;
    let mut total = Value::Int(0);
    for (i, item) in list.iter().enumerate() {
        total = match (&total, item) {
            (_, v) if i == 0 => v.clone(),
            (Value::Int(a), Value::Int(b)) => Value::Int(
                a.checked_add(*b)
                    .ok_or_else(|| ExecutionError::Overflow("+", Value::Int(*a), Value::Int(*b)))?,
            ),
            (Value::UInt(a), Value::UInt(b)) => {
                Value::UInt(a.checked_add(*b).ok_or_else(|| {
                    ExecutionError::Overflow("+", Value::UInt(*a), Value::UInt(*b))
                })?)
            }
            (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
            (a, b) => {
                return Err(ExecutionError::no_such_overload(
                    "_+_",
                    vec![format!("{:?}", a.type_of()), format!("{:?}", b.type_of())],
                ));
            }
        };
    }
    ret(total)
}

fn extreme<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    name: &str,
    keep: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let list = list_arg(&args[0], name)?;
    let mut best: Option<&Value> = None;
    for item in list.iter() {
        best = match best {
            Some(b) if compare(item, b)? != keep => Some(b),
            _ => Some(item),
        };
    }
    match best {
        Some(v) => ret(v.clone()),
        None => Err(ExecutionError::function_error(
            name,
            format!("{name} called on empty list"),
        )),
    }
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "min", Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "max", Ordering::Greater)
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let list = list_arg(&args[0], "indexOf")?;
    let pos = list
        .iter()
        .position(|v| *v == args[1])
        .map_or(-1, |p| p as i64);
    ret(Value::Int(pos))
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let list = list_arg(&args[0], "lastIndexOf")?;
    let pos = list
        .iter()
        .rposition(|v| *v == args[1])
        .map_or(-1, |p| p as i64);
    ret(Value::Int(pos))
}

fn strings(args: &[Value], function: &str) -> Result<(Arc<String>, regex::Regex), ExecutionError> {
    match (&args[0], &args[1]) {
        (Value::String(s), Value::String(re)) => {
            let re =
                regex::Regex::new(re).map_err(|e| ExecutionError::function_error(function, e))?;
            Ok((Arc::clone(s), re))
        }
        _ => Err(ExecutionError::function_error(
            function,
            "expected string arguments",
        )),
    }
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let (s, re) = strings(&args, "find")?;
    let found = re
        .find(&s)
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    ret(Value::String(Arc::new(found)))
}

fn find_all_limited<'b, 'v>(args: &[Value], limit: i64) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, re) = strings(args, "findAll")?;
    let limit = if limit < 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let found: Vec<Value> = re
        .find_iter(&s)
        .take(limit)
        .map(|m| Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    ret(Value::List(Arc::new(found)))
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    find_all_limited(&args, -1)
}

fn find_all_n<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let args = values(&args)?;
    let limit = match args.get(2) {
        Some(Value::Int(n)) => *n,
        _ => -1,
    };
    find_all_limited(&args, limit)
}
