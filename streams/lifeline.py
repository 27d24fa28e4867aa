"""Children that die with their parent, whatever killed it (SIGKILL and ``os._exit`` included).

Linux's ``PR_SET_PDEATHSIG`` asks the kernel to signal a process when the thread that created it
exits; it survives ``execve``, so it also covers ``redis-server`` started through a shell.  Set in
the child, it races with a parent that died before the call: the child checks that its parent is
still the one it was given and signals itself otherwise.  On other systems it does nothing and
the supervisor's orderly teardown is all there is.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


class ParentGone(SystemExit):
    """Raised in a child by the signal its parent's death sends: unwinds ``finally`` blocks
    (a decoder unlinks its shared-memory ring) instead of dying on the spot."""


def die_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> bool:
    """Ask for ``signum`` when the parent dies; signal ourselves if it already has.  Returns
    whether the kernel took the request (False off Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os.kill(os.getpid(), signum)
    return True


def parent_alive(parent_pid: int) -> bool:
    """Whether the parent given is still this process's parent: its death shows here at once
    (the kernel re-parents its children as it exits), before the parent-death signal is
    handled, which a starved Python process may take seconds to do."""
    return os.getppid() == parent_pid


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def tied_to_parent(command: list[str], signum: int = signal.SIGTERM) -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that run ``command`` as a child that gets
    ``signum`` when this process (the thread that starts it) dies: through util-linux's
    ``setpriv --pdeathsig``, which needs no ``preexec_fn`` (unsafe in a threaded process),
    else through a ``preexec_fn`` that asks the kernel itself."""
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        name = signal.Signals(signum).name.removeprefix("SIG")
        return {"args": [setpriv, "--pdeathsig", name, "--", *command]}
    parent_pid = os.getpid()

    def preexec() -> None:
        die_with_parent(parent_pid, signum)

    return {"args": command, "preexec_fn": preexec}


def raise_parent_gone_on(
    signum: int,
    *,
    parent_pid: int,
    stopping: Callable[[], bool],
    on_gone: Callable[[], None] = lambda: None,
    leaving: Callable[[], bool] = lambda: False,
) -> None:
    """In a child: turn ``signum`` into :class:`ParentGone`, so cleanup runs, when it means
    the end: the parent died (the parent-death signal), or the parent is stopping us
    (``stopping()``: it asked, then terminated a child that did not finish).  Otherwise it
    was meant for the whole process group (a service manager stopping everything) and the
    parent, which got it too, coordinates the stop: ignored.

    ``on_gone()`` runs first, on every such signal: an exception raised while a finalizer
    runs (``__del__``, where a signal's handler may land) is printed and dropped by the
    interpreter, so the child must also learn it some other way (a flag its loops look at);
    and what must not wait for the unwinding (a decoder's ring unlinked) belongs there.  It
    must take no lock: a second signal can interrupt the handler inside it
    (``threading.Event.set`` deadlocks there).

    :class:`ParentGone` is raised once: a parent that exits sends the parent-death signal
    again each time the child is handed to another of its threads as they exit one by one
    (``getppid()`` still names it), and a second exception would cut short, anywhere, the
    cleanup the first one started.  Nor is it raised once ``leaving()``: the child learnt
    some other way (its pipe to the parent closed) and its cleanup has begun."""
    raised = False

    def handle(received: int, _frame: object) -> None:
        nonlocal raised
        if os.getppid() != parent_pid or stopping():
            on_gone()
            if not raised and not leaving():
                raised = True  # before the raise: a signal that interrupts it raises nothing
                raise ParentGone(128 + received)

    signal.signal(signum, handle)
