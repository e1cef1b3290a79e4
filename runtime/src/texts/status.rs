//! Status companions: their description, and the notes and details of their answers.

use crate::ToolError;

/// A status answer's note when the arguments gave fields beside the key but not a whole call
/// (`err`: the target's refusal, naming what is missing), so the record was checked against
/// the key alone.
pub(crate) fn status_partial_call(target: &str, err: &ToolError) -> String {
    format!(
        "only the key was checked: the arguments beside it are not a whole `{target}` call ({}), so whether this record is theirs is not known; give every argument of the `{target}` call asked about to learn whether this record is that call's, not another action's under the same key",
        err.message()
    )
}

/// The description of `target`'s status companion, written here once, not in every expansion.
pub(crate) fn status_description(target: &str) -> String {
    format!(
        "Read-only. Tells whether `{target}` already ran for these values and what it returned: not_found, in_progress, completed (with its result), failed (with its error), unknown, or conflict (another action holds the key: these values did not run). Call it with the same arguments as the `{target}` call when that call timed out or its outcome is unclear, before calling `{target}` again."
    )
}

/// A status answer's detail when the key has no record: no call ran, or one that failed in a way
/// safe to retry freed the key (steps it finished keep their own records, so a step may have
/// acted: a charge made before a later step failed), or the record's retention ended.
pub(crate) fn status_not_found(target: &str) -> String {
    format!(
        "no `{target}` call with these values is running or recorded as finished: none ran, or one failed in a way that is safe to retry (any step it finished, such as a payment, is kept and not done again when `{target}` is called again), or its record's retention ended"
    )
}

/// A status answer's detail when no record is held, and a failed `target` call with these
/// values had finished a step (as its retry limit's count remembers): part of the action was
/// done.
pub(crate) fn status_not_found_after_steps(target: &str) -> String {
    format!(
        "no `{target}` call with these values is running or recorded as finished, but one failed after a step of it finished: part of the action was done; any step it finished, such as a payment, is kept and not done again when `{target}` is called again; tell the user so, and that they must not redo the action by other means"
    )
}

/// A status answer's detail when the key's record was made by another action than the one the
/// arguments describe.
pub(crate) fn status_conflict(target: &str) -> String {
    format!(
        "another action holds this key (a `{target}` call with other arguments, or a call of another tool that builds the same key): `{target}` has not run with these arguments, and a `{target}` call with them is refused with CONFLICT"
    )
}

/// A status answer's note when the arguments named the key but not a whole call, so the record
/// could not be checked against them.
pub(crate) fn status_key_only(target: &str) -> String {
    format!(
        "only the key was checked, since no argument of `{target}` that tells calls under one key apart was given: give them as the `{target}` call had them (a default spelled out) to learn whether this record is that call's, not another action's under the same key"
    )
}
