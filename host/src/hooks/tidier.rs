//! The thread that does one hook component's housekeeping: it drops the stores of finished calls
//! (which resets their pool slots) and makes the spare instance the next call takes.
//!
//! A thread and not a task, and the work handed to it as a call starts, not as one answers: a
//! task spawned as a call answers wakes tokio's other worker, which then competes for the CPUs
//! with the caller (kubelet, reading the answer and sending its next call) just when the answer
//! goes out. Handed over as a call starts, the work runs beside the guest's run, while the caller
//! only waits (what that saves on two CPUs: bench/NOTES.md).
//!
//! The thread has a tokio runtime of its own: a spare's instantiation may run the guest's start
//! functions, whose host calls use tokio's timers and blocking pool, and a runtime owned by the
//! thread lives exactly as long as the work, so the work never meets one that is shutting down.
//! One thread per scanner's hooks, so a hook whose instantiation is slow delays only its own
//! spares. The thread ends once its [`Tidier`] is dropped (with the component's hooks) and the
//! work already handed to it is done.

use std::sync::mpsc;

use tokio::runtime::Runtime;

/// Work for the thread, given its runtime.
pub(super) type Job = Box<dyn FnOnce(&Runtime) + Send>;

/// The sending end of one hook component's thread.
pub(super) struct Tidier {
    jobs: mpsc::Sender<Job>,
}

impl Tidier {
    /// Starts the thread, which builds its runtime.
    pub(super) fn start() -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("wdp-hook-tidy".into())
            .spawn(move || {
                // Built here, not by the caller: the caller runs on an async worker, where a
                // runtime may not be dropped, as this one would be if the thread failed to start.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::warn!(
                            %error,
                            "cannot build the hook thread's runtime: the hook's calls make their own instances and drop them on their path"
                        );
                        return;
                    }
                };
                for job in queue {
                    job(&runtime);
                }
            })?;
        Ok(Tidier { jobs })
    }

    /// Hands `job` to the thread. If the thread has ended (a job panicked, or it had no runtime),
    /// the job is dropped here instead of run: what it holds (stores, slots) is given back now,
    /// on the caller's path, and what it would have made is not made.
    pub(super) fn run(&self, job: Job) {
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            drop(job);
        }
    }
}
