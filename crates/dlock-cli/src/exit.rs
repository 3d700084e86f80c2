//! Exit codes of `dlock`, distinct from each other and documented in `--help`.

/// The lock is held elsewhere and `--no-wait` was given (EX_TEMPFAIL).
pub(crate) const BUSY: i32 = 75;
/// The lock was lost while the command ran (and the command itself exited 0).
pub(crate) const LOST: i32 = 76;
/// The wait ran out (as `timeout(1)`).
pub(crate) const TIMED_OUT: i32 = 124;
/// dlock itself failed: bad URL, store unreachable, bad arguments.
pub(crate) const FAILED: i32 = 125;
/// The command was found but could not be executed.
pub(crate) const NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub(crate) const NOT_FOUND: i32 = 127;
/// Generic "no": `inspect` / `break` on a free lock, or a declined `break`.
pub(crate) const NOT_HELD: i32 = 1;

/// The exit-code table shown in `--help`.
pub(crate) const HELP: &str = "\
Exit codes:
  run:   the command's own code (128+N if it died of signal N), or
         75 lock busy (--no-wait)   124 wait timed out   76 lock lost while the command ran (and it exited 0)
         125 dlock error            126 command not executable   127 command not found
         128+N if signal N ended the wait (the command never ran);
         --busy-exit and --lost-exit choose other codes for busy and lost
  other: 0 ok, 1 lock not held or break declined, 75 busy, 76 lock lost (hold), 124 timed out,
         125 dlock error; hold: 128+N if signal N ended the wait";
