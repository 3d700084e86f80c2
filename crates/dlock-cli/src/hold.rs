//! `dlock hold NAME`: the cross-process lock taker used by tests and scripts.

use std::io::Write;

use clap::Args;
use tokio::io::AsyncReadExt;

use crate::shown::shown;
use crate::signals::{self, Signals};
use crate::take::{LockArgs, take};
use crate::{exit, fail};

#[derive(Debug, Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    lock: LockArgs,
}

pub(crate) async fn hold(url: &str, label: Option<String>, args: HoldArgs) -> i32 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => return fail(&e.into()),
    };
    let label = label.or_else(|| Some("dlock hold".into()));
    let args = args.lock;
    let guard = tokio::select! {
        taken = take(url, label, &args) => match taken {
            Ok(guard) => guard,
            Err(code) => return code,
        },
        sig = signals.recv() => return signals::exit_code(sig),
    };
    let mut out = std::io::stdout();
    if writeln!(out, "acquired {}", guard.fence())
        .and_then(|()| out.flush())
        .is_err()
    {
        // Nobody is listening any more; let go.
        let _ = guard.release().await;
        return exit::FAILED;
    }
    let stdin_closed = async {
        let mut sink = [0u8; 256];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        () = guard.lost() => {
            eprintln!("dlock: lock {} lost", shown(&args.name));
            return args.lost_exit.into();
        }
        () = stdin_closed => {}
        _ = signals.recv() => {}
    }
    match guard.release().await {
        Ok(()) => 0,
        Err(dlock::Error::NotOwned { .. }) => {
            eprintln!("dlock: lock {} was lost before release", shown(&args.name));
            args.lost_exit.into()
        }
        Err(e) => fail(&e.into()),
    }
}
