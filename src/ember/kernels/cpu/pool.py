"""ember's own worker threads for row-chunked kernels: the caller never waits for a late thread.

A numba ``prange`` region (OpenMP underneath) ends at a barrier that every thread of the team
must reach: when another process holds a core, each region waits for the preempted thread, a
time slice at a time, and a decode step has over a hundred of them (a 135M model decoded at
2 threads fell below its 1-thread speed on a busy machine). This pool runs a *job* (a kernel
over the chunks of a weight's rows) by work claiming instead:

- the caller (the "master") publishes the job and claims chunks itself; workers that are awake
  claim the others with a compare-and-swap on one 64-bit ticket (the job's generation, its
  chunk count and the next free chunk), so a worker that was asleep or preempted when the job
  started simply finds nothing left to take;
- the master waits only for chunks a worker has claimed and not finished; when that wait was
  long (the worker was preempted mid-chunk), the next jobs run on the master alone, a few
  after a rare preemption, more each time it happens again (``SOLO_MIN`` .. ``SOLO_MAX``);
- workers spin for about ``SPIN_CYCLES`` between jobs (a decode step's products are tens of
  microseconds apart), then sleep with a backoff up to ``MAX_SLEEP_US``.
- a worker never stays on its master's CPU: the master publishes ``sched_getcpu()`` with each
  job, and a worker that finds itself on that CPU (looking for a job, or spinning between
  jobs) takes the process's CPU mask less that CPU as its own (one ``sched_setaffinity``, only
  when they meet). Linux sometimes woke a napping worker on the CPU where the master ran with
  the other one idle; the worker then preempted the master at each wake-up and spun there, and
  the call ran on one CPU shared by both (MobileNetV2 b1 in the bench's pattern, 0.1 s idle
  then two calls: ~1 call in 5 took 5-8 ms instead of 2.2-2.5, the worker in 4-9 of its 19
  jobs, the master preempted as often as the worker napped; none such afterwards).

Every chunk writes rows of the output that no other chunk writes, and each row is computed by
one kernel call whichever thread runs it, so results are bitwise those of one thread.

A job calls, for each chunk ``[r0, r1)`` of rows and each of up to ``MAX_GROUPS`` groups of
arguments, ``fn(wi, rowb, nb, r0, r1, xq, ldx, xd, xs, ldd, y, ldy)``: the signature of the
``_idot`` kernels (``kernels.cpu.quant._idot``). The master side is two LLVM IR functions that
numba drivers call: ``ember_pool_acquire(ctrl)`` takes the pool's job block for the caller (one
caller at a time; another thread calling at the same moment gets 0 and runs its job alone, on a
block of its own: products from several Python threads never mix), then ``ember_pool_run(block,
nchunks, shared)`` runs it. The workers are Python threads parked in ``ember_pool_worker``
(machine code: no GIL held).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading

import numpy as np

from ember.kernels.cpu import built_once

MAX_GROUPS = 32  # argument groups per job (4 rows of x each in _idot: up to 128 rows)
SPIN_CYCLES = 600_000  # time-stamp cycles a worker spins after a job (~0.2 ms) before sleeping
FIRST_SLEEP_US, MAX_SLEEP_US = 50, 1000  # then sleeps of 50 us, doubling up to 1 ms
SOLO_WAIT_CYCLES = 3_000_000  # a master that waited this long (~1 ms) for a worker ...
# ... runs the next jobs alone: SOLO_MIN after a first late worker (a hypervisor's or the OS's
# rare preemption), twice as many after each further one, up to SOLO_MAX (a core another
# process keeps busy); every job the workers keep up with shortens the next solo run by one
SOLO_MIN, SOLO_MAX = 16, 4096

# ctrl: int64 words, on cache lines (8 words) by who writes them: the ticket, the done count,
# the settings, the counters (``stats``), the job
TICKET, DONE, ACTIVE, SHUTDOWN, SOLO, SOLO_LEN, LOCK, MCPU = 0, 8, 16, 17, 18, 19, 20, 21
SOLO_TRIGGERS, WORKER_JOBS = 24, 25
CHUNK, ROWS, GROUPS, WI, ROWB, NB, LDX, LDD, LDY = 32, 33, 34, 35, 36, 37, 38, 39, 40
GROUP0, GROUP_WORDS = 48, 5  # per group: fn, xq, xd, xs, y
MASK0 = GROUP0 + GROUP_WORDS * MAX_GROUPS  # the process's CPU mask (a 1024-bit cpu_set_t)
CTRL_WORDS = MASK0 + 16
_MASK20 = (1 << 20) - 1

_STATE: dict = {}
_LOCK = threading.Lock()


def _ir() -> list[str]:
    """The pool's LLVM IR: the chunk runner, the claim loop, the master and the worker."""
    i64 = "i64"
    fn_ty = "void (" + ", ".join([i64] * 12) + ")"

    def word(name: str, index: int) -> list[str]:
        return [
            f"  %{name}p = getelementptr i64, ptr %p, i64 {index}",
            f"  %{name} = load i64, ptr %{name}p, align 8",
        ]

    chunk = ["define internal void @pool_chunk(ptr %p, i64 %idx) {", "entry:"]
    for name, index in (("chunk", CHUNK), ("n", ROWS), ("ng", GROUPS), ("wi", WI),
                        ("rowb", ROWB), ("nb", NB), ("ldx", LDX), ("ldd", LDD), ("ldy", LDY)):  # fmt: skip
        chunk += word(name, index)
    chunk += [
        "  %r0 = mul i64 %idx, %chunk",
        "  %r1e = add i64 %r0, %chunk",
        "  %r1 = call i64 @llvm.umin.i64(i64 %r1e, i64 %n)",
        "  br label %grp",
        "grp:",
        "  %g = phi i64 [0, %entry], [%g1, %grp]",
        f"  %gw = mul i64 %g, {GROUP_WORDS}",
        f"  %base = add i64 %gw, {GROUP0}",
        "  %fp = getelementptr i64, ptr %p, i64 %base",
    ]
    for j, name in enumerate(("fn", "xq", "xd", "xs", "y")):
        chunk += [
            f"  %{name}p = getelementptr i64, ptr %fp, i64 {j}",
            f"  %{name} = load i64, ptr %{name}p, align 8",
        ]
    chunk += [
        "  %f = inttoptr i64 %fn to ptr",
        f"  call {fn_ty} %f(i64 %wi, i64 %rowb, i64 %nb, i64 %r0, i64 %r1, i64 %xq, i64 %ldx,"
        " i64 %xd, i64 %xs, i64 %ldd, i64 %y, i64 %ldy)",
        "  %g1 = add i64 %g, 1",
        "  %more = icmp ult i64 %g1, %ng",
        "  br i1 %more, label %grp, label %out",
        "out:",
        "  ret void",
        "}",
    ]
    claim = [
        # take chunks of job `gen` until none is left (or another job has started): the master
        # from the front, workers from the back, so that each streams through memory in order
        "define internal void @pool_claim(ptr %p, i64 %gen, i1 %back) {",
        "entry:",
        f"  %donep = getelementptr i64, ptr %p, i64 {DONE}",
        "  br label %loop",
        "loop:",
        "  %t = load atomic i64, ptr %p acquire, align 8",
        "  %tg = lshr i64 %t, 40",
        "  %same = icmp eq i64 %tg, %gen",
        "  br i1 %same, label %check, label %out",
        "check:",
        f"  %front = and i64 %t, {_MASK20}",
        "  %t20 = lshr i64 %t, 20",
        f"  %end = and i64 %t20, {_MASK20}",
        "  %left = icmp ult i64 %front, %end",
        "  br i1 %left, label %take, label %out",
        "take:",
        "  %tf = add i64 %t, 1",
        f"  %tb = sub i64 %t, {1 << 20}",
        "  %t1 = select i1 %back, i64 %tb, i64 %tf",
        "  %last = sub i64 %end, 1",
        "  %idx = select i1 %back, i64 %last, i64 %front",
        "  %cx = cmpxchg ptr %p, i64 %t, i64 %t1 acq_rel acquire, align 8",
        "  %ok = extractvalue { i64, i1 } %cx, 1",
        "  br i1 %ok, label %run, label %loop",
        "run:",
        "  call void @pool_chunk(ptr %p, i64 %idx)",
        "  %old = atomicrmw add ptr %donep, i64 1 release, align 8",
        "  br label %loop",
        "out:",
        "  ret void",
        "}",
    ]
    run = [
        # the master: run the job in block %ctrl (its fields written) over nch chunks; %shared:
        # the block is the pool's (its lock held: workers may help, the lock is released at
        # the end), else a caller's own block, run alone. Returns the cycles it waited.
        "define i64 @ember_pool_run(i64 %ctrl, i64 %nch, i64 %shared) {",
        "entry:",
        "  %p = inttoptr i64 %ctrl to ptr",
        f"  %lockp = getelementptr i64, ptr %p, i64 {LOCK}",
        f"  %activep = getelementptr i64, ptr %p, i64 {ACTIVE}",
        f"  %solop = getelementptr i64, ptr %p, i64 {SOLO}",
        "  %own = icmp eq i64 %shared, 0",
        "  br i1 %own, label %sloop0, label %pool",
        "pool:",
        "  %active = load atomic i64, ptr %activep monotonic, align 8",
        "  %solo = load i64, ptr %solop, align 8",
        "  %none = icmp eq i64 %active, 0",
        "  %one = icmp ule i64 %nch, 1",
        "  %issolo = icmp ne i64 %solo, 0",
        "  %a1 = or i1 %none, %one",
        "  %alone = or i1 %a1, %issolo",
        "  br i1 %alone, label %serial, label %publish",
        "serial:",
        "  br i1 %issolo, label %dec, label %sloop0",
        "dec:",
        "  %solo1 = sub i64 %solo, 1",
        "  store i64 %solo1, ptr %solop, align 8",
        "  br label %sloop0",
        "sloop0:",
        "  %any = icmp ne i64 %nch, 0",
        "  br i1 %any, label %sloop, label %sdone",
        "sloop:",
        "  %i = phi i64 [0, %sloop0], [%i1, %sloop]",
        "  call void @pool_chunk(ptr %p, i64 %i)",
        "  %i1 = add i64 %i, 1",
        "  %smore = icmp ult i64 %i1, %nch",
        "  br i1 %smore, label %sloop, label %sdone",
        "sdone:",
        "  br i1 %own, label %sret, label %srelease",
        "srelease:",
        "  store atomic i64 0, ptr %lockp release, align 8",
        "  br label %sret",
        "sret:",
        "  ret i64 0",
        "publish:",
        "  %mc = call i32 @sched_getcpu()",
        "  %mc64 = sext i32 %mc to i64",
        f"  %mcp = getelementptr i64, ptr %p, i64 {MCPU}",
        "  store atomic i64 %mc64, ptr %mcp monotonic, align 8",
        "  %t = load atomic i64, ptr %p monotonic, align 8",
        "  %tg = lshr i64 %t, 40",
        "  %g1 = add i64 %tg, 1",
        "  %gen = and i64 %g1, 16777215",
        f"  %donep = getelementptr i64, ptr %p, i64 {DONE}",
        "  store atomic i64 0, ptr %donep monotonic, align 8",
        "  %gs = shl i64 %gen, 40",
        "  %ns = shl i64 %nch, 20",
        "  %tk = or i64 %gs, %ns",
        "  store atomic i64 %tk, ptr %p release, align 8",
        "  call void @pool_claim(ptr %p, i64 %gen, i1 false)",
        "  %c0 = call i64 @llvm.readcyclecounter()",
        "  br label %wait",
        "wait:",
        "  %d = load atomic i64, ptr %donep acquire, align 8",
        "  %busy = icmp ult i64 %d, %nch",
        "  br i1 %busy, label %spin, label %finished",
        "spin:",
        "  call void @llvm.x86.sse2.pause()",
        "  br label %wait",
        "finished:",
        "  %c1 = call i64 @llvm.readcyclecounter()",
        "  %waited = sub i64 %c1, %c0",
        f"  %lenp = getelementptr i64, ptr %p, i64 {SOLO_LEN}",
        "  %len = load i64, ptr %lenp, align 8",
        f"  %late = icmp ugt i64 %waited, {SOLO_WAIT_CYCLES}",
        "  br i1 %late, label %gosolo, label %calm",
        "gosolo:",  # alone for `len` jobs; twice as long after the next late worker
        "  store i64 %len, ptr %solop, align 8",
        "  %len2 = shl i64 %len, 1",
        f"  %len3 = call i64 @llvm.umin.i64(i64 %len2, i64 {SOLO_MAX})",
        "  store i64 %len3, ptr %lenp, align 8",
        f"  %trigp = getelementptr i64, ptr %p, i64 {SOLO_TRIGGERS}",
        "  %trig = atomicrmw add ptr %trigp, i64 1 monotonic, align 8",
        "  br label %back",
        "calm:",  # each job the worker kept up with shortens the next solo run
        "  %lm = sub i64 %len, 1",
        f"  %lm2 = call i64 @llvm.umax.i64(i64 %lm, i64 {SOLO_MIN})",
        "  store i64 %lm2, ptr %lenp, align 8",
        "  br label %back",
        "back:",
        "  store atomic i64 0, ptr %lockp release, align 8",
        "  ret i64 %waited",
        "}",
    ]
    acquire = [
        # 1 when the caller now holds the pool's block (its lock), 0 when another caller does
        "define i64 @ember_pool_acquire(i64 %ctrl) {",
        "entry:",
        "  %p = inttoptr i64 %ctrl to ptr",
        f"  %lockp = getelementptr i64, ptr %p, i64 {LOCK}",
        "  %cx = cmpxchg ptr %lockp, i64 0, i64 1 acquire monotonic, align 8",
        "  %ok = extractvalue { i64, i1 } %cx, 1",
        "  %r = zext i1 %ok to i64",
        "  ret i64 %r",
        "}",
    ]
    away = [
        # a worker on the CPU its master last published leaves it: the process's CPU mask less
        # that CPU becomes the thread's (one syscall, only when they meet; see the docstring)
        "define internal void @pool_away(ptr %p) {",
        "entry:",
        "  %buf = alloca [16 x i64], align 8",
        f"  %mp = getelementptr i64, ptr %p, i64 {MCPU}",
        "  %m = load atomic i64, ptr %mp monotonic, align 8",
        "  %c = call i32 @sched_getcpu()",
        "  %c64 = sext i32 %c to i64",
        "  %same = icmp eq i64 %c64, %m",
        "  %inr = icmp ult i64 %m, 1024",
        "  %go = and i1 %same, %inr",
        "  br i1 %go, label %copy, label %done",
        "copy:",
        "  %i = phi i64 [0, %entry], [%i1, %copy]",
        "  %acc = phi i64 [0, %entry], [%acc1, %copy]",
        f"  %wi = add i64 %i, {MASK0}",
        "  %srcp = getelementptr i64, ptr %p, i64 %wi",
        "  %v = load i64, ptr %srcp, align 8",
        "  %wsel = lshr i64 %m, 6",
        "  %isw = icmp eq i64 %i, %wsel",
        "  %bitn = and i64 %m, 63",
        "  %bit = shl i64 1, %bitn",
        "  %nbit = xor i64 %bit, -1",
        "  %vm = and i64 %v, %nbit",
        "  %v2 = select i1 %isw, i64 %vm, i64 %v",
        "  %dstp = getelementptr [16 x i64], ptr %buf, i64 0, i64 %i",
        "  store i64 %v2, ptr %dstp, align 8",
        "  %acc1 = or i64 %acc, %v2",
        "  %i1 = add i64 %i, 1",
        "  %more = icmp ult i64 %i1, 16",
        "  br i1 %more, label %copy, label %set",
        "set:",
        "  %any = icmp ne i64 %acc1, 0",  # another CPU is left to go to
        "  br i1 %any, label %call, label %done",
        "call:",
        "  %rc = call i32 @sched_setaffinity(i32 0, i64 128, ptr %buf)",
        "  br label %done",
        "done:",
        "  ret void",
        "}",
    ]
    worker = [
        # a worker thread's whole life: wait for jobs, take chunks, until ctrl[SHUTDOWN] != 0
        "define void @ember_pool_worker(i64 %ctrl, i64 %id) {",
        "entry:",
        "  %p = inttoptr i64 %ctrl to ptr",
        f"  %activep = getelementptr i64, ptr %p, i64 {ACTIVE}",
        f"  %downp = getelementptr i64, ptr %p, i64 {SHUTDOWN}",
        "  %t0 = load atomic i64, ptr %p acquire, align 8",
        "  %seen0 = lshr i64 %t0, 40",
        "  %start0 = call i64 @llvm.readcyclecounter()",
        "  br label %wait",
        "wait:",
        "  %seen = phi i64 [%seen0, %entry], [%tg, %job], [%seen, %spin], [%seen, %nap]",
        "  %start = phi i64 [%start0, %entry], [%now2, %job], [%start, %spin], [%start, %nap]",
        f"  %sleep = phi i64 [{FIRST_SLEEP_US}, %entry], [{FIRST_SLEEP_US}, %job],"
        " [%sleep, %spin], [%sleep2, %nap]",
        "  %down = load atomic i64, ptr %downp monotonic, align 8",
        "  %stop = icmp ne i64 %down, 0",
        "  br i1 %stop, label %out, label %look",
        "look:",
        "  %t = load atomic i64, ptr %p acquire, align 8",
        "  %tg = lshr i64 %t, 40",
        "  %new = icmp ne i64 %tg, %seen",
        "  br i1 %new, label %mine, label %idle",
        "mine:",
        "  call void @pool_away(ptr %p)",
        "  %active = load atomic i64, ptr %activep monotonic, align 8",
        "  %takes = icmp ult i64 %id, %active",
        "  br i1 %takes, label %work, label %job",
        "work:",
        "  call void @pool_claim(ptr %p, i64 %tg, i1 true)",
        f"  %wjp = getelementptr i64, ptr %p, i64 {WORKER_JOBS}",
        "  %wj = atomicrmw add ptr %wjp, i64 1 monotonic, align 8",
        "  br label %job",
        "job:",
        "  %now2 = call i64 @llvm.readcyclecounter()",
        "  br label %wait",
        "idle:",
        "  call void @pool_away(ptr %p)",
        "  call void @llvm.x86.sse2.pause()",
        "  %now = call i64 @llvm.readcyclecounter()",
        "  %spent = sub i64 %now, %start",
        f"  %tired = icmp ugt i64 %spent, {SPIN_CYCLES}",
        "  br i1 %tired, label %nap, label %spin",
        "spin:",
        "  br label %wait",
        "nap:",
        "  %us = trunc i64 %sleep to i32",
        "  %rc = call i32 @usleep(i32 %us)",
        "  %s2 = shl i64 %sleep, 1",
        f"  %sleep2 = call i64 @llvm.umin.i64(i64 %s2, i64 {MAX_SLEEP_US})",
        "  br label %wait",
        "out:",
        "  ret void",
        "}",
    ]
    decls = [
        "declare i64 @llvm.readcyclecounter()",
        "declare void @llvm.x86.sse2.pause()",
        "declare i32 @usleep(i32)",
        "declare i32 @sched_getcpu()",
        "declare i32 @sched_setaffinity(i32, i64, ptr)",
        "declare i64 @llvm.umax.i64(i64, i64)",
    ]
    parts = (chunk, claim, run, acquire, away, worker)
    return decls + ["\n".join(part) for part in parts]


def state() -> dict | None:
    """Compile the pool once: {"run": address, "ctrl": array, ...}, or None where it cannot run."""
    return built_once(_STATE, _LOCK, _build)


def _build() -> dict:
    from ember.kernels.cpu import gemm as G

    if G.isa() is None:  # no llvmlite / AVX2 here: the callers' fallbacks run
        return {"ok": False}
    import llvmlite.binding as llvm

    libc = ctypes.CDLL(None)
    for name in ("usleep", "sched_getcpu", "sched_setaffinity"):
        llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
    engine = G.jit_ir(_ir(), ["ember_pool_run", "ember_pool_acquire", "ember_pool_worker"])
    # the control block lives as long as the process (workers may read it until they stop:
    # never memory that interpreter shutdown frees), on cache-line boundaries
    libc.calloc.restype = ctypes.c_void_p
    addr = libc.calloc(CTRL_WORDS + 8, 8)
    if not addr:
        return {"ok": False}
    addr += -addr % 64
    ctrl = np.ctypeslib.as_array(ctypes.cast(addr, ctypes.POINTER(ctypes.c_int64)), (CTRL_WORDS,))
    ctrl[SOLO_LEN] = SOLO_MIN
    ctrl[MCPU] = -1  # no master CPU published yet
    mask = ctrl[MASK0:].view(np.uint64)
    for cpu in os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ():
        if cpu < 1024:
            mask[cpu // 64] |= np.uint64(1 << (cpu % 64))
    worker = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address("ember_pool_worker")
    )
    return {"ok": True, "engine": engine, "ctrl": ctrl, "worker": worker, "threads": [],
            "pid": os.getpid()}  # fmt: skip


def set_workers(n: int) -> None:
    """Let n worker threads take part in jobs (threads - 1), starting those not yet running."""
    st = state()
    if st is None:
        return
    with _LOCK:
        if st["pid"] != os.getpid():  # a forked child: its parent's workers are not here
            st["threads"], st["pid"] = [], os.getpid()
        ctrl, threads = st["ctrl"], st["threads"]
        addr = ctrl.ctypes.data
        while len(threads) < n:
            t = threading.Thread(
                target=st["worker"], args=(addr, len(threads)), daemon=True,
                name=f"ember-pool-{len(threads)}",
            )  # fmt: skip
            t.start()
            threads.append(t)
        ctrl[ACTIVE] = n  # workers with id >= n keep sleeping
        st["configured"] = True


def _stop_workers() -> None:
    """At exit: the workers leave their loop before the interpreter (and the JIT) goes away."""
    if _STATE.get("ok") and _STATE["pid"] == os.getpid():
        _STATE["ctrl"][SHUTDOWN] = 1
        for t in _STATE["threads"]:
            t.join(timeout=1.0)


def _after_fork_in_child() -> None:
    if _STATE.get("ok"):
        _STATE["ctrl"][ACTIVE] = 0  # no workers until set_workers starts new ones
        _STATE["threads"], _STATE["pid"] = [], os.getpid()
        _STATE["configured"] = False


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_stop_workers)


def bind(g: dict, *words: str) -> None:
    """Give a numba driver's module globals what it calls and fills: ``_run``
    (``ember_pool_run(block, nchunks, shared)``), ``_acquire`` (``ember_pool_acquire(block)``)
    and ``_WORD`` for each named job word (``CHUNK``, ``ROWS``, ...)."""
    from numba import types

    i64 = types.int64
    g["_run"] = types.ExternalFunction("ember_pool_run", i64(i64, i64, i64))
    g["_acquire"] = types.ExternalFunction("ember_pool_acquire", i64(i64))
    for name in words:
        g[f"_{name}"] = globals()[name]


def _submit_items_py(ctrl, own, d, fn, items):  # pragma: no cover - compiled
    """Run ``items`` tasks of fn on descriptor d, one item each, on the pool (on ``own`` alone
    when another thread holds the pool's job block)."""
    shared = _acquire(ctrl.ctypes.data)
    if shared == 0:
        ctrl = own
    ctrl[CHUNK] = 1
    ctrl[ROWS] = items
    ctrl[GROUPS] = 1
    ctrl[WI] = d.ctypes.data
    ctrl[GROUP0] = fn
    _run(ctrl.ctypes.data, items, shared)


_SUBMIT: list = []
_acquire = _run = None  # ember_pool_acquire / ember_pool_run, bound by submit_items


def submit_items():
    """``submit(ctrl, own, d, fn, items)`` compiled once for the numba drivers whose tasks are
    one item each (kernels.cpu.irblock's blocks, kernels.cpu.stem's bands)."""
    if not _SUBMIT:
        import numba as nb

        bind(globals())
        _SUBMIT.append(nb.njit(nogil=True, cache=True)(_submit_items_py))
    return _SUBMIT[0]


def ctrl() -> np.ndarray:
    """The pool's job block, which numba drivers take with ember_pool_acquire before filling
    it (workers started for the current thread count)."""
    st = _STATE if _STATE.get("ok") else state()
    if not st.get("configured"):
        from ember.threads import get_num_threads

        set_workers(max(0, min(get_num_threads(), os.cpu_count() or 1) - 1))
    return st["ctrl"]


_own = threading.local()  # a thread's own job block, for when another thread holds the pool's


def run_groups(common: tuple, groups: list, rows: int, chunk: int) -> None:
    """A job from Python (the numba drivers of _idot do the same in machine code): for each
    chunk of ``rows`` and each group ``(fn, x, y)``, ``fn(wi, rowb, nb, r0, r1, x, ldx, 0, 0,
    nb, y, ldy)`` with ``common = (wi, rowb, nb, ldx, ldy)``."""
    st = _STATE if _STATE.get("ok") else state()
    c = ctrl()
    fns = st.get("c_fns")
    if fns is None:
        engine, i64 = st["engine"], ctypes.c_int64
        run = ctypes.CFUNCTYPE(i64, i64, i64, i64)(engine.get_function_address("ember_pool_run"))
        acq = ctypes.CFUNCTYPE(i64, i64)(engine.get_function_address("ember_pool_acquire"))
        fns = st["c_fns"] = (run, acq, c.ctypes.data)
    run, acq, addr = fns
    shared = acq(addr)
    blk, baddr = c, addr
    if not shared:  # another thread holds the pool's block: this job runs alone, on our own
        blk = getattr(_own, "blk", None)
        if blk is None:
            blk = _own.blk = np.zeros(CTRL_WORDS, np.int64)
        baddr = blk.ctypes.data
    wi, rowb, nb, ldx, ldy = common
    blk[CHUNK], blk[ROWS], blk[GROUPS], blk[WI], blk[ROWB] = chunk, rows, len(groups), wi, rowb
    blk[NB], blk[LDX], blk[LDD], blk[LDY] = nb, ldx, nb, ldy
    for j, (fn, x, y) in enumerate(groups):
        o = GROUP0 + GROUP_WORDS * j
        blk[o], blk[o + 1], blk[o + 2], blk[o + 3], blk[o + 4] = fn, x, 0, 0, y
    run(baddr, -(-rows // chunk), shared)


def run_items(fn: int, desc: int, items: int, chunk: int = 1) -> None:
    """``fn(desc, 0, 0, i0, i1, ...)`` over items [0, items) in chunks of ``chunk``, on the pool."""
    run_groups((desc, 0, 0, 0, 0), [(fn, 0, 0)], items, chunk)


_INTRINSICS: list = []


def intrinsics():
    """(ld, vptr) for numba task functions that read a descriptor: ``ld(addr, i)`` the int64 at
    addr + 8 * i, ``vptr(addr)`` an address as a void pointer (for ``numba.carray``)."""
    if _INTRINSICS:
        return _INTRINSICS[0]
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def ld(typingctx, addr, index):
        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
            return builder.load(builder.gep(ptr, [args[1]]))

        return types.int64(types.int64, types.int64), codegen

    @intrinsic
    def vptr(typingctx, addr):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

        return types.voidptr(types.int64), codegen

    _INTRINSICS.append((ld, vptr))
    return ld, vptr


def reconfigure() -> None:
    """Take the thread count (``ember.set_num_threads``) into account at the next job."""
    _STATE["configured"] = False


def stats() -> dict:
    """Counters since start: jobs, jobs a worker took part in, times the master went solo."""
    st = state()
    if st is None:
        return {}
    c = st["ctrl"]
    return {"jobs": int(c[TICKET]) >> 40, "worker_jobs": int(c[WORKER_JOBS]),
            "solo_triggers": int(c[SOLO_TRIGGERS]), "workers": int(c[ACTIVE])}  # fmt: skip
