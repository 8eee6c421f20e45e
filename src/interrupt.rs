//! Ctrl-C (SIGINT) and SIGTERM for lockstep's long commands, `sim sweep` and `chaos run`: the first signal sets a
//! flag the command polls (it then finishes what is under way, reports and exits 130) and writes the command's
//! message to stderr at once; the handler resets itself (`SA_RESETHAND`), so a second signal ends the process at
//! once. One handler for the process: a command calls [`catch`] once and [`release`] when it is done.
//! And SIGPIPE for commands whose output is only printed ([`end_quietly_on_a_closed_pipe`]).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static MESSAGE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MESSAGE_LEN: AtomicUsize = AtomicUsize::new(0);
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

extern "C" fn on_signal(signal: libc::c_int) {
    SIGNAL.store(signal, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
    let (message, len) = (MESSAGE.load(Ordering::SeqCst), MESSAGE_LEN.load(Ordering::SeqCst));
    if !message.is_null() {
        // SAFETY: write(2) is async-signal-safe; the buffer is the `&'static str` given to `catch`.
        unsafe {
            libc::write(2, message.cast_const().cast(), len);
        }
    }
}

/// Installs the handler (once: `SA_RESETHAND`) for SIGINT and SIGTERM, which writes `message` (a line, e.g.
/// `"\ninterrupted: … (interrupt again to stop at once)\n"`) to stderr and sets the returned flag. The command may
/// set the flag itself too (to stop for a reason of its own).
pub fn catch(message: &'static str) -> &'static AtomicBool {
    STOP.store(false, Ordering::SeqCst);
    SIGNAL.store(0, Ordering::SeqCst);
    MESSAGE_LEN.store(message.len(), Ordering::SeqCst);
    MESSAGE.store(message.as_ptr().cast_mut(), Ordering::SeqCst);
    for signal in SIGNALS {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only stores to atomics,
        // loads from them and calls write(2), all async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
    &STOP
}

/// The signal that came since [`catch`], if one did: `Ctrl-C` (SIGINT) or `SIGTERM`.
pub fn signal() -> Option<&'static str> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        libc::SIGINT => Some("Ctrl-C"),
        _ => Some("SIGTERM"),
    }
}

/// Gives the signals back their default action; returns [`signal`].
pub fn release() -> Option<&'static str> {
    for signal in SIGNALS {
        // SAFETY: restores the default disposition.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
        }
    }
    signal()
}

/// Gives SIGPIPE back its default action (end the process, silently) for a command whose output is only printed:
/// `lockstep sim run … | head -1` (or a project's own simulator binary's) then stops at the closed pipe instead of
/// panicking in `println!` (Rust ignores SIGPIPE by default, so each write fails with EPIPE). Not for `serve` and
/// `agent`: they write to their job processes' pipes and must outlive a closed one. Call it first thing in `main`,
/// before any thread exists.
pub fn end_quietly_on_a_closed_pipe() {
    // SAFETY: sets a signal's disposition to its default; the callers do so before any thread exists.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
