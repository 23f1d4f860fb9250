//! The checks of a scenario's speaker policy: its order, its selector rules and what they match,
//! its approval checkpoints.

use super::*;

/// The order, its sequence and its first speaker.
pub(super) fn check_order(
    p: &PolicySpec,
    known: &dyn Fn(&str) -> bool,
    policy: &mut TurnPolicy,
) -> Result<(), RpcError> {
    policy.order = Some(p.order);
    for (i, s) in p.sequence.iter().enumerate() {
        if !known(s) {
            return Err(bad(
                &format!(".policy.sequence[{i}]"),
                format!("{s:?} is not a participant"),
            ));
        }
    }
    match (p.order, p.sequence.is_empty()) {
        (Order::Sequence, true) => {
            return Err(bad(
                ".policy.sequence",
                "a sequence order needs the list of speakers",
            ))
        }
        (Order::Sequence, false) => policy.first = p.sequence[0].clone(),
        (_, false) => {
            return Err(bad(
                ".policy.sequence",
                "only a sequence order takes a sequence",
            ))
        }
        _ => {}
    }
    if let Some(first) = &p.first {
        if !known(first) {
            return Err(bad(
                ".policy.first",
                format!("{first:?} is not a participant"),
            ));
        }
        if p.order == Order::Sequence && *first != p.sequence[0] {
            return Err(bad(
                ".policy.first",
                "a sequence starts with its first speaker",
            ));
        }
        policy.first = first.clone();
    }
    Ok(())
}

/// Selector rules: known speakers and authors, paths and operators that make sense.
pub(super) fn check_rules(p: &PolicySpec, known: &dyn Fn(&str) -> bool) -> Result<(), RpcError> {
    if p.order == Order::Rules && p.rules.is_empty() {
        return Err(bad(
            ".policy.rules",
            "a rules order needs at least one rule",
        ));
    }
    for (i, r) in p.rules.iter().enumerate() {
        if !known(&r.next) {
            return Err(bad(
                &format!(".policy.rules[{i}].next"),
                format!("{:?} is not a participant", r.next),
            ));
        }
        if let Some(a) = &r.when.author {
            if !known(a) {
                return Err(bad(
                    &format!(".policy.rules[{i}].when.author"),
                    format!("{a:?} is not a participant"),
                ));
            }
        }
        for (j, m) in r.when.matches.iter().enumerate() {
            check_match(&format!(".policy.rules[{i}].when.match[{j}]"), m)?;
        }
    }
    Ok(())
}

/// One `match` of a rule, at `at`.
pub(super) fn check_match(at: &str, m: &MatchSpec) -> Result<(), RpcError> {
    if !valid_path(&m.path) {
        return Err(bad(
            &format!("{at}.path"),
            format!("{:?} is not a path such as $.data.tool", m.path),
        ));
    }
    match (m.op, &m.value) {
        (MatchOp::Exists, Some(_)) => Err(bad(&format!("{at}.value"), "exists takes no value")),
        (MatchOp::Exists, None) | (MatchOp::ContainsAny, Some(Value::Array(_))) => Ok(()),
        (MatchOp::ContainsAny, _) => Err(bad(&format!("{at}.value"), "contains_any takes a list")),
        (_, None) => Err(bad(&format!("{at}.value"), "this operator needs a value")),
        _ => Ok(()),
    }
}

/// Approval checkpoints: known participants, nobody approving itself.
pub(super) fn check_approvals(
    p: &PolicySpec,
    known: &dyn Fn(&str) -> bool,
) -> Result<(), RpcError> {
    for (i, a) in p.approvals.iter().enumerate() {
        for (field, id) in [("before", &a.before), ("approver", &a.approver)] {
            if !known(id) {
                return Err(bad(
                    &format!(".policy.approvals[{i}].{field}"),
                    format!("{id:?} is not a participant"),
                ));
            }
        }
        if a.before == a.approver {
            return Err(bad(
                &format!(".policy.approvals[{i}].approver"),
                "a participant cannot approve itself",
            ));
        }
    }
    Ok(())
}
