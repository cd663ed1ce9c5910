"""Claims of a fleet of workers (issue 36 part 5): attempts, lost claims and worker CPU per run,
before (runs an application started and left, found by polling) and after (runs submitted to the
queue, claimed under the journal's claim lock), beside the cost of flow control per claim.

Usage: ``python benchmarks/bench_claims.py [--runs 300] [--tools 4] [--backends sqlite,postgres]
[--shapes 1x32,4x8] [--modes poll,queue,keyed] [--repeats 3] [--pg URL] [--json out.json]
[--profile PREFIX]``

Each cell: a new journal with ``--runs`` runs of an agent that calls ``--tools`` effect-free
tools, one per turn, on a canned model that answers at once (the loop and the journal are all
that costs); then W worker processes of concurrency C (shape ``WxC``) start together and drive
every run to its end (``Worker.run(until_idle=True)``). Modes:

- ``poll``: the runs are started as an application starts one and goes away (their first event
  written, nobody holds them): workers find them by polling ``open_runs`` and race to take them
  over; a takeover another worker won is a lost claim (``WorkerStats.busy``). This is how every
  run was claimed before the queue.
- ``queue``: the runs are submitted (:func:`cuaderno.flow.submit`): workers claim them through
  the queue, one claimer at a time per journal.
- ``keyed``: as ``queue``, each run with one of 8 concurrency keys, each limited to 1000 (never
  binding: what counting in-progress runs per key costs).

Reported per cell, from outside the workers: claim attempts (runs taken + claims lost), lost
claims and their share, worker CPU per run (user + system of the worker processes, from
``resource.getrusage`` in each, summed, over the runs), wall time; and from inside, the time a
worker spends in the queue's ``claim`` per call and per run taken (the cost of flow control per
claim: its reads, the holds, the limits and the takeover).

Measured (``--runs 300 --repeats 3``: medians of CPU per run, each repeat's value in brackets;
claims summed over the three repeats; a shared 2-CPU machine at load average 6.9 at the start,
10.8 at the end, other sessions' work included):

========  ======  =====  ==============  ============  =====================  ========
backend   mode    shape  attempts/runs   lost          CPU/run ms             wall s
========  ======  =====  ==============  ============  =====================  ========
SQLite    poll    1x32   900/900         0             5.3 [5.3 4.8 5.3]      10.2
SQLite    poll    4x8    1214/900        314 (25.9%)   7.7 [9.0 7.6 7.7]      10.1
SQLite    queue   1x32   900/900         0             4.0 [4.0 4.0 3.7]      4.1
SQLite    queue   4x8    949/900         0 (49 stale)  5.5 [5.5 4.9 5.6]      6.6
SQLite    keyed   1x32   900/900         0             4.0 [4.0 4.2 3.9]      4.2
SQLite    keyed   4x8    928/900         0 (28 stale)  5.5 [5.5 6.5 5.5]      5.0
Postgres  poll    1x32   900/900         0             8.4 [8.5 8.4 7.2]      13.7
Postgres  poll    4x8    1214/900        314 (25.9%)   11.0 [10.5 11.0 12.5]  6.7
Postgres  queue   1x32   900/900         0             6.4 [6.4 6.1 7.0]      5.0
Postgres  queue   4x8    900/900         0             9.7 [10.2 9.2 9.7]     3.7
Postgres  keyed   1x32   900/900         0             7.5 [6.8 7.5 8.3]      6.3
Postgres  keyed   4x8    900/900         0             12.1 [13.3 11.2 12.1]  4.6
========  ======  =====  ==============  ============  =====================  ========

With the batched takeover (a claim takes over every run it picked in one transaction: one synced
commit per claim) and the task read from the queue row (``--modes queue --repeats 3``, load
average 10.6 at the start, 10.0 at the end; the table above was before it, measured again before
the change on the day: SQLite 4.3 and 5.8 ms, 1.33; PostgreSQL 7.4 and 10.6 ms, 1.43):

========  =====  ==============  ============  =====================  ======  ===================
backend   shape  attempts/runs   lost          CPU/run ms             wall s  claim ms/call, /run
========  =====  ==============  ============  =====================  ======  ===================
SQLite    1x32   900/900         0             3.2 [3.4 3.2 3.1]      3.1     8.1, 0.35
SQLite    4x8    955/900         0 (55 stale)  5.3 [5.3 5.3 5.9]      7.1     74.5, 16.4
Postgres  1x32   900/900         0             6.9 [6.9 6.5 8.6]      7.9     34.6, 1.5
Postgres  4x8    900/900         0             10.1 [9.3 11.0 10.1]   6.4     82.8, 12.4
========  =====  ==============  ============  =====================  ======  ===================

CPU per run 4x8 / 1x32: 1.68 (SQLite), 1.46 (PostgreSQL): the target of 1.2 is not met. The
claim's own cost fell (per run taken, 3.7 to 0.35 ms with one worker on SQLite, 4.6 to 1.5 on
PostgreSQL: it was the synced takeovers), and one worker gained the most from it. With four, the
claim's wall time is mostly the wait for the claim lock and the write lock, not CPU. A fixed
piece of work measured in every worker meanwhile (``_Probe``: hashing and JSON, its CPU taken
out of the worker's) cost 864 and 905 us (SQLite), 894 and 935 us (PostgreSQL) in the 1x32 and
4x8 cells: 1.05x, so the machine's contention explains little of the ratio. Where the four
processes' extra CPU goes (``--profile``, cProfile on a CPU clock in each worker, the claim's
thread not included; SQLite, 300 runs, main threads 5.2 s at 1x32 against 6.7 s at 4x8): run
summaries parsed 6,705 times against 2,711 (each process's summary cache is emptied whenever
another connection has committed, so nearly every append of four processes re-reads and parses
its run's summary: +0.54 s), 702 group transactions against 401 (groups of 8 runs, not 32: +0.3
s), and each process's scans of the open runs (+0.25 s).

A second run (load average 7.3, after the worker stopped parsing every open run's summary at
start when submitted runs of its agent wait): SQLite 3.8 [3.8 3.4 4.2] and 6.0 [5.9 6.0 6.6]
ms, 1.55 (probe 1.07); PostgreSQL 7.9 [8.3 7.9 7.0] and 10.6 [9.0 10.9 10.6] ms, 1.35 (probe
1.10); 0 lost, 44 stale of 944 on SQLite. Two things measured that are *not* the gap: the
summary re-reads (the same SQLite cells with each process's summary cache kept across other
processes' commits, an unsafe change made only for this measurement: 3.9 and 5.9 ms, 1.53), and
each worker's fixed cost (``--runs 4``: about 15-40 ms of CPU per process, 0.2-0.5 ms per run at
300 runs). What is left is spread over the step path of four processes each committing smaller
groups (about 7 appends per transaction against 20), and no single change found here moves it.

Where the four processes' extra CPU goes (2026-12-07, queue mode, 300 runs; per-thread CPU from
``time.thread_time`` in each thread, rusage for the process, ``strace -f -c``, ``perf record``,
``py-spy``; a 2-CPU machine at load average 2-6 shared with other sessions):

- Almost all of it is the main thread's (the event loop: the runs, their group commits). The
  other threads: the claim's (``asyncio.to_thread``): SQLite 0.06-0.14 ms per run at 1x32,
  0.34-0.45 at 4x8; PostgreSQL 0.24-0.31 and 0.64-0.76; and on PostgreSQL the connection pool's
  workers, 0.01-0.04 ms. There is no heartbeat, lease or poller thread: PostgreSQL's LISTEN is
  read on the loop, SQLite's holds are kernel record locks. On PostgreSQL the main thread waits
  for the server at every statement: 19 voluntary context switches per run at 1x32, 33 at 4x8
  (and about 21 involuntary ones in both), each on two CPUs shared with the server's processes.
- Most of the gap is the concurrency of one worker, not the number of processes: one process at
  concurrency 8 against 32 (medians of 4 interleaved runs, after the changes below): SQLite 1x32
  2.8, 2x16 3.3, 1x8 3.7, 4x8 4.1 ms; PostgreSQL 1x32 4.3, 1x8 5.5, 4x8 6.6 ms. A run makes
  about ten appends; at concurrency 8 they commit in groups of at most 8 (mean about 6), at 32 in
  groups of about 27, so each run pays for more transactions (SQLite 1x32 about 400 transactions
  for 300 runs, 310 of them each run's final commit alone; 4x8 about 700-760), and each claim
  takes fewer runs (13-21 claims against 45-77). ``perf``, 1x8 against 1x32: +0.29 ms per run in
  the interpreter, +0.12 in the kernel (the virtio kicks of the extra syncs, context switches),
  +0.19 in the claim's thread.
- Four processes add, on SQLite (``strace -f -c``, 1x32 against 4x8): pread64 1,309 against
  12,709 (SQLite drops its page cache whenever another connection committed, and reads the pages
  again), fdatasync 1,356 against 1,876, fcntl 17,203 against 28,794, futex 338 against 2,917
  (the claim's thread and the loop taking turns at the GIL), clock_nanosleep 0 against 1,233
  (SQLite's busy handler waiting for another process's write lock: sleeps, not spinning), flock
  0 against 69 (claims waiting for the claim lock); and every process's own start (open, one
  look, close: SQLite 6-8 ms for one worker, 22-28 ms for four; PostgreSQL 13-17 and 49-58 ms:
  0.06-0.15 ms per run at 300 runs, the ``fixed`` column). Process start-up proper (the
  interpreter, imports) is not in the measure: the workers are forked after the imports and no
  module is imported while they run.
- Not the gap: the WAL (at most 4.2 MB in both shapes: its checkpoints keep up); the summaries
  each process re-reads after another's commit (the same cells with the cache kept across other
  processes' commits, an unsafe change made only to measure it: 4x8 5.41 against 5.44 ms).

What was changed (one commit each), and the same invocations before (main) and after, three each,
``--modes queue --repeats 3`` (CPU per run 4x8 and 1x32 in ms, medians of the three repeats; the
ratio; stale claims of 900):

- a claim reads a window of the best candidates (2 x (free + skipped) + 64 rows) before all 512,
  probes holds from the lock bytes alone (it read each run's owner record and resolved the hold
  file's path once per run), and marks the queue rows of ended runs done inside its takeover's
  transaction (one synced commit per claim, not two). Its thread's CPU per run at 4x8 on SQLite
  fell from 0.34-0.45 to 0.20-0.27 ms, and a claim is quick enough that the runs it picks rarely
  end before its takeover (stale claims 44, 78, 112 of 900 before; 3, 0, 2 after);
- a PostgreSQL store that claims keeps its lock connection open between runs (it was closed
  whenever no run was held and opened again, with its five statements, at nearly every claim:
  9-10 connections per worker per 300 runs, now 1);
- a worker no longer reads the open runs' summaries (up to 200, and a queue lookup per run, at
  start and every 4 poll intervals while busy) while every open run is the queue's;
- a claim asks for the keys' runs in progress only when a candidate has a key.

=========  =============================  =============================
backend    before (main)                  after
=========  =============================  =============================
SQLite     4.1/2.8 1.48; 5.5/3.1 1.79;    3.7/2.7 1.37; 4.5/3.5 1.27;
           4.3/2.8 1.55                   3.6/3.0 1.20
Postgres   7.6/4.4 1.73; 8.7/6.3 1.39;    6.8/4.2 1.64; 7.3/6.0 1.23;
           7.5/4.9 1.53                   7.0/4.6 1.53
=========  =============================  =============================

The ratio less the workers' fixed cost: SQLite 1.46, 1.78, 1.53 before, 1.35, 1.26, 1.19 after;
PostgreSQL 1.71, 1.37, 1.51 before, 1.61, 1.21, 1.50 after. The fixed probe's CPU 4x8 / 1x32:
0.97-1.06. The target of 1.2 is not met: SQLite's 4x8 CPU per run fell by about a seventh and its
ratio to about 1.2-1.35 (the middle after-run's 1x32 cell, 3.5 ms, was a slow repeat); PostgreSQL
gained little (its four workers' extra round trips per run are most of what is left). What is
left is mostly what concurrency 8 costs in any one process (groups a quarter the size: one
worker at concurrency 8 costs 1.3x one at 32 on SQLite, 1.27x on PostgreSQL), then the page
cache SQLite drops at every other process's commit and the context switches of eight processes
(four workers, their database) on two cores. One more invocation after, with one worker at
concurrency 8 beside (``--shapes 1x32,1x8,4x8``, load average 4.2 to 5.6): SQLite 3.3, 4.0 and
4.5 ms (1.38); PostgreSQL 6.0, 7.0 and 7.0 ms (1.18). PostgreSQL's 1x32 cell alone ranged over
4.2-6.3 ms across these invocations, which is most of the spread of its ratio (1.18-1.64).

(Another PostgreSQL poll 4x8 run: 146 of 446 attempts lost, 32.7%.) Lost claims: none through the
queue; a *stale* claim picked a run its holder closed between the claim's read and its takeover
(refused by the takeover's own check, nothing written; SQLite, whose holds are probed after the
candidates are read). CPU per run, 4x8 against 1x32: poll 1.46 (SQLite) and 1.30 (PostgreSQL),
queue 1.39 and 1.52, keyed 1.38 and 1.60; earlier single runs of the PostgreSQL queue cell gave
1.11 and 1.13. The queue costs less CPU per run than polling in every cell; the ratio of four
workers to one stays above the 1.2 aimed at on this machine: four processes of 8 runs make
groups of commits a quarter the size of one process of 32 (more transactions per step), and
four processes' fixed costs are spread over a quarter of the runs each. The claim itself: 54-117
ms per call, nearly all of it the synced takeovers it makes (one per run taken, the one the loop
would make anyway); per run, 2.3-3.2 ms with one worker, 12-21 ms of wall time with four (spent
waiting in a thread for the claim lock another worker holds, not CPU). Counting a key's runs in
progress (keyed against queue): nothing measurable on SQLite, about 1 ms per run on PostgreSQL
(within the noise of this machine).

Counts that do not move with the load (2026-12-07, later). Each cell also reports, per run, from
every thread of every worker: read and write system calls and the bytes read (``/proc/self/io``),
context switches and system CPU (``getrusage``), PostgreSQL exchanges (each wait of psycopg for
the server), the claim's own thread CPU (``time.thread_time`` inside ``claim``), and the scans
of the open runs and schedules (``Worker._scan_due``); each the median over the repeats. Five
invocations alternating before (558e759) and after (the scan change below), ``--runs 300
--modes queue --shapes 1x32,4x8 --backends sqlite,postgres --repeats 3``, load average 3.2 to
6.3 (other sessions' work included). CPU per run in ms, the medians of the five invocations'
cells; the ratio 4x8 / 1x32 of each invocation, and their median:

=========  ===========  ===========  ==================================  ======
backend    1x32 ms      4x8 ms       ratio per invocation                median
=========  ===========  ===========  ==================================  ======
SQLite     3.46 / 3.85  5.13 / 4.78  1.59 1.46 1.87 1.22 1.42 before     1.46
                                     1.24 1.17 1.55 1.43 1.37 after      1.37
Postgres   5.98 / 6.50  8.88 / 8.72  1.63 1.46 1.37 1.10 1.82 before     1.46
                                     1.34 1.34 1.38 1.37 1.35 after      1.35
=========  ===========  ===========  ==================================  ======

(before / after in the CPU columns.) The after medians of the ratio are lower, but the 1x32 cells
moved up by as much as 4x8 moved down, which the change cannot do (one worker of 32 scanned 11
times in 300 runs before, 2-3 after): this is the machine's noise, as is each invocation's ratio
(1.10 to 1.87 before). The target of 1.2 is not met. The counts, medians of the five (before and
after alike unless given as before -> after):

==================================  ===============  ===============  ===============  ===============
per run                             SQLite 1x32      SQLite 4x8       Postgres 1x32    Postgres 4x8
==================================  ===============  ===============  ===============  ===============
group transactions                  1.34             2.35-2.41        1.34             2.28
claims                              0.043            0.18-0.19        0.043            0.150
claim's thread CPU, ms              0.06-0.07        0.22-0.23        0.11             0.34-0.35
scans of the open runs, schedules   0.037 -> 0.007   0.110 -> 0.027   0.037 -> 0.010   0.137 -> 0.040
system CPU, ms                      0.42-0.44        0.76-0.88        0.98-1.07        1.59-1.75
read calls (KiB read)               6.1 (12.5)       25-29 (87-104)   -                -
write calls                         32.4             51.3             -                -
voluntary context switches          7.6              14-15            16-24            27-30
PostgreSQL exchanges                -                -                41.5             50.9
==================================  ===============  ===============  ===============  ===============

What the extra CPU of four workers of 8 is, by these counts and by profiles of the same cells
(cProfile on a CPU clock in each worker's main thread, 300 runs, one invocation each, load
average 6-11):

- One process at concurrency 8 costs nearly what four do: SQLite 1x32, 1x8, 4x8 3.2, 4.0 and 4.1
  ms per run in one invocation at load average 9-10 (system CPU 0.22, 0.45, 0.69 ms). A run makes 10 appends: its 9
  steps' commits join its process's group (at most ``concurrency`` appends: 8 against about 30),
  and its final commit, a synchronous ``commit`` in the loop's ``finish``, is a transaction of
  its own in both shapes (in the profiled PostgreSQL cells 346 of 4x8's 679 transactions, 311 of
  1x32's 401), then the release is another. So 4x8 pays about one transaction more per run, and it is the loop's
  grouping, not the claims, that sets it.
- The same Python work costs more CPU with four processes: PostgreSQL's workers made 2.75 M
  function calls against 2.54 M (1.08x) and spent 13.1 s against 8.4 s of main-thread CPU
  (1.56x). SQLite (1x32, 1x8, 4x8): 1.69 M, 1.73 M, 1.77 M calls, 5.6, 5.8, 7.3 s. Where the
  calls differ on SQLite at 4x8: statements 14,128 / 14,884 / 19,241, of them the summary
  written by ``_write_summary`` 300 / 300 / 2,722 (the check that the row still holds the text
  this connection stored, made after another process's commit) and the file checks
  (``check_journal``, ``_compress_setting``, ``_refuse_without_key``) 3 / 3 / 457 each; and the
  BEGIN IMMEDIATE and COMMIT statements' own time per transaction, 158 us at 1x8 against 296 us
  at 4x8 (the write lock's waits, the pages re-read after another process's commit).
- Claims: the claim's thread costs about the same CPU per claim in both shapes (SQLite 1.2-1.4
  ms, PostgreSQL 2.3-2.4 ms), and four workers of 8 claim 3.5 to 4 times as often per run (each
  claim takes 5.5-6.7 runs, against 23): SQLite 0.16, PostgreSQL 0.23 ms per run of the gap. A PostgreSQL claim makes 13 exchanges with the server (two transactions); one transaction
  would save about 3 of them, 0.15 claims per run x 3: not measurable here, not made.
- Scans: a worker looked through the open runs and its schedules at every wake whose runs had all
  ended (a worker's runs step together, so about once per ``concurrency`` runs): 30 looks per 300
  runs for four workers of 8, 11 for one of 32, each a thread hop and two reads. The runs a claim
  just took now count as busy: 2-3 looks per worker (its first, its last, one per 4 poll
  intervals while busy).
  Its CPU is below this machine's noise (the counts above are what moved).

Tried and not kept (each measured in two alternated pairs of single invocations, SQLite):

- ``PRAGMA mmap_size=256 MiB`` on every connection (a change made only for the measurement): read
  calls per run at 4x8 20.6 and 24.5 -> 15.1 and 15.5 (70-86 -> 48-50 KiB), but system CPU at
  1x32 0.30 and 0.34 -> 0.55 and 0.52 ms; CPU per run no better (ratios 1.44, 1.91 against 1.35,
  1.42).
- The final commit through the loop's group (``await log.commit_before_acting()`` in
  ``ModelSteps.finish``, a change to the loop made only for the measurement, outside this work's
  files): group transactions per run 1x32 1.34 -> 0.38, 4x8 2.54-2.58 -> 1.54-1.75; write calls
  32.2 -> 23.0 and 52-54 -> 44-46; voluntary context switches 8.1 -> 4.7-5.1 and 16-17 -> 13.6;
  CPU per run 1x32 3.3 and 3.5 against 3.7 and 3.1 ms, 4x8 4.6 and 5.7 against 4.9 and 4.6 ms:
  one transaction fewer per run in both shapes (so the ratio of transactions grows), CPU within
  the noise. Worth measuring on a quiet machine for throughput; it does not lower the ratio.

The meta rows read after another process's commit (2026-12-07, later). After each commit of
another connection a SQLite store read the journal's schema version, its encryption record (with
whether the keys table exists) and its compress setting again, in 3 or 4 statements
(``_follow_meta``, from ``_fresh``); it now reads them in one, and derives nothing again when they
are the rows it last derived from (every refusal kept: ``tests/journal/test_follow_meta.py``).
Counted in a profile of each (main thread, 300 runs, SQLite 4x8): statements per run 40.7 -> 36.1
(1x32: 28.5 both); ``_follow_meta`` with its statements 44.7 -> 21.5 ms of main-thread time in 300
runs under cProfile, about 0.08 ms per run of 5-6: below what this machine resolves. Ten
invocations, ``--modes queue --shapes 1x32,1x8,4x8 --backends sqlite,postgres --repeats 3``, in the
order before, after, after, before, after, before, before, after, before, after (before: main at
d7ce056; load average 2.6 to 10.1, other sessions' work included). CPU per run in ms, 1x32 / 1x8 /
4x8, and the ratios 4x8 / 1x32 and 4x8 / 1x8:

========  ======  =============================================  =====================  ===========
backend   code    each invocation (1x32/1x8/4x8, r32, r8)        medians of the cells   ratios, med
========  ======  =============================================  =====================  ===========
SQLite    before  3.95/4.64/5.18 1.31 1.12; 3.66/4.41/5.61 1.53  4.11 / 4.64 / 5.34     1.31, 1.12
                  1.27; 4.24/4.24/3.89 0.92 0.92; 4.55/5.32/6.61
                  1.45 1.24; 4.11/5.11/5.34 1.30 1.04
SQLite    after   3.62/5.16/6.13 1.69 1.19; 4.52/6.35/6.77 1.50   4.13 / 5.14 / 5.99     1.48, 1.19
                  1.07; 4.13/4.41/5.70 1.38 1.29; 4.17/5.14/5.55
                  1.33 1.08; 4.05/4.62/5.99 1.48 1.29
Postgres  before  10.0/11.6/14.3 1.42 1.23; 7.33/9.08/10.2 1.39   7.96 / 9.53 / 10.75    1.42, 1.23
                  1.12; 6.13/8.53/10.8 1.75 1.26; 9.09/9.53/10.6
                  1.16 1.11; 7.96/9.65/12.4 1.56 1.29
Postgres  after   7.90/9.49/9.04 1.14 0.95; 7.54/8.28/10.1 1.34   7.54 / 8.63 / 10.13    1.34, 1.22
                  1.22; 7.30/8.63/11.0 1.51 1.28; 8.10/7.67/10.0
                  1.23 1.30; 6.72/9.22/10.2 1.52 1.11
========  ======  =============================================  =====================  ===========

No claim lost in any cell (27,000 runs per backend; one stale claim, on SQLite). The change cannot
make any cell dearer (it only removes statements), and PostgreSQL's code did not change at all:
its median ratio moved by 0.08 between identical code, SQLite's by 0.17 the wrong way, so a median
of five invocations here resolves nothing under about 0.2 of the ratio. **The target of 1.2 is not met**:
4x8 / 1x32 ranged 0.92-1.69 (SQLite) and 1.14-1.75 (PostgreSQL) per invocation, medians 1.3-1.5;
4x8 / 1x8 (four processes against one, at the same concurrency) 0.92-1.30, medians 1.1-1.2.

Where the 4x8 cell's extra CPU goes, by the main thread's clock (``--profile`` now uses
``time.thread_time``; with ``process_time`` the CPU of the claim's and the probe's threads, which
run while the main thread waits in a statement, was counted in that statement: ``execute`` 502 ->
961 ms from 1x8 to 4x8, against 375 -> 596 ms by the thread's own clock):

- The transactions' BEGIN IMMEDIATE and COMMIT (timed with ``time.thread_time`` around each, a
  change made only for the measurement, one invocation at load average 7-13): per run, BEGIN
  0.05 (1x32), 0.09 (1x8), 0.28 ms (4x8): SQLite's busy handler retrying while another process
  holds the write lock (each worker of 4x8 spent 3.5 s of a 5.6 s cell's wall time there,
  asleep), and the page cache dropped after another's commit; COMMIT 0.59, 0.89, 0.89 ms (about
  0.25 ms per transaction in every shape: the frames' write and the fdatasync, system CPU).
- The same Python work costs more: at 1x8 and 4x8 the same functions are called the same number
  of times, and take 20-30% more main-thread time at 4x8 (``fingerprint._fast_ok`` 299 -> 358 ms
  for 54,000 calls; ``plainjson`` 191 -> 250 ms for 19,500): four processes sharing two cores
  (their caches, their switches), where the probe's fixed work, done between the workers' turns,
  shows only 1.03-1.10.
- Re-reading the runs' summaries after another's commit (``sqlite.py``'s ``_group_summaries``,
  ``_read_summary``, ``_write_summary``: summaries read 300 -> 2,851, 6.7 -> 20.9 ms): not in this
  work's files, and measured before as no part of the gap.
- Not changed: a PostgreSQL claim's round trips (13 exchanges per claim, 0.15 claims per run at
  4x8: at most 0.45 of 50 exchanges per run). Its lock cannot share a statement with the first
  read: the read's snapshot would be taken before the lock is granted, so the previous claimer's
  takeovers would not be seen.

The writers' queue, mmap and the cost of a small group (2026-12-08; SQLite, ``--runs 300 --modes
queue --shapes 1x32,1x8,4x8 --backends sqlite --repeats 3``; main at 8a6eec2 against variants,
alternated in one script; load average 2.6 to 7.9, other sessions' work included). CPU per run
in ms, 1x32 / 1x8 / 4x8, the ratios 4x8 / 1x32 and 4x8 / 1x8, and per run of the 4x8 cell the
read calls and voluntary context switches (medians of the three repeats):

- A queued kernel lock in front of ``BEGIN IMMEDIATE`` (an exclusive ``flock`` on
  ``<journal>-write`` per store, taken before the transaction and dropped after its end; the wait
  bounded by the busy timeout through a waiter thread of the store's, since a blocking ``flock``
  cannot time out; written for this measurement and not kept). Three pairs, base then queue:
  2.45/3.27/3.88 1.58 1.19 | 2.64/3.33/4.47 1.69 1.34; 2.57/3.23/3.87 1.50 1.20 | 2.54/3.22/3.92
  1.54 1.22; 2.60/3.30/4.09 1.57 1.24 | 2.59/3.32/4.46 1.72 1.34. Reads 25-29 -> 50, voluntary
  switches 14-16 -> 23-26, wall 2.7-3.8 -> 2.1-2.3 s: the fleet is faster by the clock and dearer
  by the CPU. Then the queue without its waiter thread (a blocking ``flock`` in the writer's own
  thread, no timeout: a variant made only for the measurement), three rounds of base, queue,
  direct: 4x8 3.73, 3.50, 3.65 (base); 4.38, 3.99, 4.11 (queue); 4.02, 3.83, 3.88 (direct); reads
  26-32, 49-60, 44-60; switches 14-15, 22-26, 15-19. So the thread's hand-offs cost about 0.2 ms
  per run, and the rest is the queue itself: writers that take strict turns each find another
  process's commit before nearly every transaction, so SQLite drops its page cache and reads the
  pages again about twice as often as when its busy handler lets a process that just committed
  write again while the others sleep. Not kept.
- ``PRAGMA mmap_size=268435456`` on the writer (again, three rounds of base, queue, mmap, queue and
  mmap): 4x8 3.88, 3.75, 3.82 (base) against 3.93, 3.70, 4.46 (mmap), ratios 1.45, 1.42, 1.49
  against 1.49, 1.59, 1.80; reads 22-26 -> 18-24 (WAL frames are still read with ``pread``: the map
  covers the database file only). With the queue: 4.19, 4.43, 4.69 (reads 39-40). Not kept, as
  before (nor its caveats taken on: a file shrunk under the map by ``VACUUM`` of another
  process, an I/O error that becomes SIGBUS).
- A small group's own Python work (``--profile``, one invocation, main-thread CPU under cProfile
  2.18 s at 1x32 against 2.52 s at 1x8; 401 against 733 group transactions): per transaction the
  ``BEGIN IMMEDIATE`` and ``COMMIT`` statements take 141 us of the main thread's CPU in both shapes
  (the sync's kernel time is counted there), while the leader's own Python per group (the own
  time of ``_lead``, ``append_group`` and ``_txn``, with the anchor's write, ``_fresh`` and
  ``_check_file`` whole) is about 90 us under the profiler: 1.1 more transactions per run at 1x8
  cost about 0.16 ms in the statements and at most about 0.1 ms in that Python (less without the
  profiler), which even halved is below what these invocations resolve (main's 4x8 cell ranged
  3.50-4.09 ms). Nothing changed.

**The target of 1.2 is not met**: 4x8 / 1x32 1.42-1.58 on main in these nine invocations.

PostgreSQL's round trips per run (2026-12-08). Each wait of psycopg that waited on the socket,
counted by the code that sent it (``psycopg.Connection.wait`` wrapped, one invocation per cell,
``--runs 300 --modes queue --repeats 1``; the ``PostgreSQL exchanges`` column also counts waits
that return at once, such as the pool's ``commit`` of an idle connection, so it reads higher):

======================  ===========  ===========  ===========  ===========
per run                 main 1x32    main 4x8     after 1x32   after 4x8
======================  ===========  ===========  ===========  ===========
group writes            8.08         14.24        6.45         10.98
summary reads           10.00        10.00        4.00         4.00
load (replay)           6.00         6.00         5.00         5.00
release and unlock      5.00         5.00         2.00         2.00
claim and takeover      0.54         2.25         0.54         2.35
LISTEN, connections     0.16         0.63         0.16         0.63
scans, other            1.2          1.7          1.2          1.7
all                     31.0         39.9         19.3         26.7
======================  ===========  ===========  ===========  ===========

What grows with the number of processes: the group writes (about 2.3 transactions per run at
4x8 against 1.34 at 1x32: groups of at most 8 appends; the loop's grouping, not changed here), the
claims (0.15-0.17 per run against 0.043, about 12 round trips each) and each process's connections.
What was changed (one commit each):

- a summary read (``checkpoint``, five per run) reads the schema's version in the same statement
  (one round trip, was two); a release of a run the store took writes the released holder record
  by one statement when the row still holds the record it wrote (one, was four: BEGIN, the locked
  read, UPDATE, COMMIT; otherwise as before);
- an append's rows go in one ``INSERT ... SELECT FROM unnest(arrays)`` (the dialect's
  ``insert_many``) instead of ``executemany``, and a group's rows ride in its summaries' upsert (a
  data-modifying ``WITH``): a group transaction of several runs is BEGIN, the rows locked, one
  statement, COMMIT;
- a load opens its snapshot with ``BEGIN ISOLATION LEVEL REPEATABLE READ`` (one, was two);
- a claim hands the worker each taken run's summary, read by the takeover with the row locked
  (the worker's own read after the claim is gone: one per run).

Tried and not kept: psycopg's pipeline mode for every append transaction (waits per run 41.5 ->
49.5 at 1x32, 51-54 -> 67 at 4x8, more voluntary context switches, CPU per run less the fixed
cost no better: 1x32/4x8 4.2/6.0 and 3.6/5.7 ms before, 4.3/5.7 and 4.1/5.9 after, two
alternated pairs of single repeats); psycopg already prepares a
statement server-side from its fifth use (``prepare_threshold`` 5). Not changed: a claim's takeover
in the claim's own transaction would save BEGIN, COMMIT and the schema read (3 of about 12 round
trips per claim, 0.45 per run at 4x8), at the cost of moving the ``queue.C1`` crash point and the
lock give-back past the claim's COMMIT.

Each commit against the one before, three invocations alternated (before, after, ...), ``--runs
300 --modes queue --shapes 1x32,1x8,4x8 --backends postgres --repeats 3``, load average 1.7-8.3
(other sessions' work included). CPU per run in ms 1x32/1x8/4x8 (each the median of its three
repeats), and the ratios 4x8/1x32, 4x8/1x8:

==================  ==============================================  ===========================
change              before                                          after
==================  ==============================================  ===========================
reads, release      5.3/5.5/7.0 1.32 1.27; 5.2/6.6/6.7 1.29 1.02;    4.8/5.9/6.4 1.33 1.08;
                    4.3/5.4/6.7 1.56 1.24                           3.9/5.2/5.9 1.51 1.13;
                                                                    4.3/5.5/6.9 1.60 1.25
rows in one         4.0/5.1/6.7 1.68 1.31; 3.9/5.6/6.1 1.56 1.09;    3.6/5.4/5.8 1.61 1.07;
statement           3.4/5.3/6.0 1.76 1.13                           3.7/5.2/5.6 1.51 1.08;
                                                                    3.7/5.0/6.0 1.62 1.20
load's BEGIN        3.8/4.7/6.4 1.68 1.36; 3.9/5.6/6.0 1.54 1.07;    4.4/5.0/6.0 1.36 1.20;
                    4.0/5.0/5.5 1.38 1.10                           4.2/5.2/5.6 1.33 1.08;
                                                                    4.0/5.2/5.7 1.43 1.10
claim's summaries   3.7/4.8/5.7 1.54 1.19; 3.5/5.1/5.8 1.66 1.14;    3.7/4.9/5.6 1.51 1.14;
                    3.7/5.0/5.9 1.59 1.18                           3.7/5.4/6.0 1.62 1.11;
                                                                    3.7/4.9/5.4 1.46 1.10
all (main, after)   4.0/6.0/6.1 1.52 1.02; 4.2/5.7/5.9 1.40 1.04;    3.7/4.5/5.5 1.49 1.22;
                    4.5/6.1/6.0 1.33 0.98                           3.5/5.0/5.5 1.57 1.10;
                                                                    3.6/5.1/5.4 1.50 1.06
==================  ==============================================  ===========================

Main against all four changes, medians of the three invocations: 1x32 4.2 -> 3.6 ms, 1x8 6.0 ->
5.0, 4x8 6.0 -> 5.5 (8-17% less CPU per run); the bench's exchanges per
run 41.4 -> 26.5 (1x32), 51-53 -> 33-36 (4x8); the claim's thread 0.25-0.32 -> 0.29-0.38 ms per
run at 4x8 (it now decodes the summaries the worker read). **The target of 1.2 is not met**:
4x8/1x32 1.33-1.52 (median 1.40) before, 1.49-1.57 (1.50) after; 4x8/1x8 0.98-1.04 and
1.06-1.22. The round trips cut are mostly ones every run pays in every shape, so the CPU fell in
both cells and the ratio did not move (within this machine's noise); what four processes pay
more is the loop's smaller groups and the claims, about 7.4 round trips per run of the 26.7 (8.9
of 39.9 on main).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cuaderno import Agent, ModelRequest, ModelResponse, ScriptedGateway, StepEvent, open_journal, tool
from cuaderno.fingerprint import fingerprint
from cuaderno.flow import set_limit, submit
from cuaderno.journal import JournalQueue
from cuaderno.worker import Worker

PG_URL = os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test")
KEYS = 8


@tool(effect_free=True)
def step(n: int) -> str:
    """Do nothing much."""
    return f"step {n} done"


def _agent() -> Agent:
    return Agent(instructions="take your steps", tools=[step], name="claims-bench")


def _gateway(tools: int) -> ScriptedGateway:
    def script(request: ModelRequest) -> ModelResponse:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return ScriptedGateway.call("step", n=turn) if turn < tools else ScriptedGateway.text("done")
    return ScriptedGateway(script, cost=None)


def _prepare(url: str, mode: str, runs: int) -> None:
    agent = _agent()
    store = open_journal(url)
    try:
        if mode == "keyed":
            for k in range(KEYS):
                set_limit(store, f"key-{k}", 1000)
        for i in range(runs):
            task = f"run {i}"
            if mode == "poll":  # an application's first event, then it went away
                start = {"task": task, "versions": agent.versions(), "tenant": "default"}
                store.append([StepEvent(run_id=f"r{i:05d}", step_id="run", phase="start", kind="run", name=agent.name,
                                        fingerprint=fingerprint({"task": task}), payload=start)])
            else:
                submit(store, agent, task, run_id=f"r{i:05d}",
                       concurrency_key=f"key-{i % KEYS}" if mode == "keyed" else None)
    finally:
        store.close()


def _worker(url: str, concurrency: int, tools: int, barrier: Any, out: Any, profile: str | None = None) -> None:
    timing = {"calls": 0, "taken": 0, "stale": 0, "empty": 0, "seconds": 0.0, "cpu_s": 0.0}
    original = JournalQueue.claim

    def timed(self: JournalQueue, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        found = original(self, **kwargs)
        timing["seconds"] += time.perf_counter() - t0
        timing["cpu_s"] += time.thread_time() - c0  # the claim's own thread: its CPU, not its waits
        timing["calls"] += 1
        timing["taken"] += len(found.taken)
        timing["stale"] += found.stale
        timing["empty"] += not found.taken  # a claim that took nothing (every waiting run held, or none left)
        return found

    JournalQueue.claim = timed  # type: ignore[method-assign]
    counts = _count_writes()
    probe = _Probe()
    worker = Worker(url, _agent(), lambda: _gateway(tools), concurrency=concurrency, log=None)  # the default poll_interval
    barrier.wait()
    before, io_before = resource.getrusage(resource.RUSAGE_SELF), _io()
    probe.start()
    if profile is None:
        stats = worker.run_sync(until_idle=True)
    else:  # where the worker's CPU goes (cProfile's own cost inflates the totals, not their shares)
        import cProfile

        # The main thread's CPU (not the waits for the write lock, nor the CPU of the claim's and
        # the probe's threads, which run while the main thread waits inside a statement).
        with cProfile.Profile(time.thread_time) as prof:
            stats = worker.run_sync(until_idle=True)
        prof.dump_stats(f"{profile}-{os.getpid()}.prof")
    probe.stop()
    after, io_after = resource.getrusage(resource.RUSAGE_SELF), _io()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - probe.spent
    # Counts the machine's load does not move much (the probe's thread reads and writes nothing):
    # the read and write system calls of every thread, the bytes they read (SQLite's page cache
    # refilled after another process's commit shows here), and the context switches.
    io = {k: io_after[k] - io_before[k] for k in io_before}
    io["vcsw"], io["ivcsw"] = after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw
    io["sys_s"] = after.ru_stime - before.ru_stime  # the kernel's share (syncs, locks, page reads, switches)
    out.put({**counts, **io, "claimed": stats.claimed, "busy": stats.busy, "completed": stats.completed, "errors": stats.errors,
             "cpu_s": cpu, "probe_us": probe.median_us(), **{f"claim_{k}": v for k, v in timing.items()}})


def _io() -> dict[str, int]:
    """This process's read and write system calls and bytes so far, all threads (``/proc``; zeros
    where there is none)."""
    found = {"syscr": 0, "syscw": 0, "rchar": 0}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in found:
                    found[name] = int(value)
    except OSError:
        pass
    return found


def _count_writes() -> dict[str, int]:
    """Counts that do not move with the machine's load, filled in while this worker runs (each
    is one transaction): its group transactions (``groups``, holding ``appends``), the appends it
    made alone through the store's own append (``store_appends``: a run's last commit is one),
    and the store's releases and takeovers."""
    from cuaderno.journal import GroupCommit, PostgresCheckpointer, SqliteCheckpointer
    from cuaderno.journal._sql_write import SqlWriter

    counts = {"groups": 0, "appends": 0, "store_appends": 0, "releases": 0, "acquires": 0, "pg_waits": 0, "scans": 0}
    close = GroupCommit.close

    def closing(self: GroupCommit) -> None:
        counts["groups"] += self.groups
        counts["appends"] += self.appends
        close(self)

    GroupCommit.close = closing  # type: ignore[method-assign]
    for cls, name, key in ((SqlWriter, "append", "store_appends"), (SqliteCheckpointer, "release", "releases"),
                           (PostgresCheckpointer, "release", "releases"), (SqliteCheckpointer, "acquire", "acquires"),
                           (PostgresCheckpointer, "acquire", "acquires")):
        original = getattr(cls, name)

        def counted(self: Any, *args: Any, _original: Any = original, _key: str = key, **kwargs: Any) -> Any:
            counts[_key] += 1
            return _original(self, *args, **kwargs)

        setattr(cls, name, counted)
    import psycopg

    wait = psycopg.Connection.wait

    def waited(self: Any, *args: Any, **kwargs: Any) -> Any:  # one exchange with the server, any thread
        counts["pg_waits"] += 1
        return wait(self, *args, **kwargs)

    psycopg.Connection.wait = waited  # type: ignore[method-assign]
    scan = Worker._scan_due

    def scanned(self: Worker, busy: bool) -> bool:  # a look through the open runs and the schedules
        due = scan(self, busy)
        counts["scans"] += due
        return due

    Worker._scan_due = scanned  # type: ignore[method-assign]
    return counts


class _Probe:
    """What one fixed piece of work (hashing and JSON, as a step does) costs in CPU in this process
    while the workers run, every ``_PROBE_EVERY_S``: on a shared 2-CPU machine, the same
    instructions cost more CPU time when more processes share the cores (caches, switches), and
    this tells that apart from the work cuaderno does. Its own CPU is taken out of the worker's."""

    def __init__(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples: list[float] = []
        self.spent = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import hashlib

        payload = {"step": "tool-3", "args": {"n": 3}, "text": "x" * 200}
        while not self._stop.wait(_PROBE_EVERY_S):
            t0 = time.thread_time()
            for i in range(200):
                hashlib.sha256(json.dumps({**payload, "i": i}, sort_keys=True).encode()).hexdigest()
            spent = time.thread_time() - t0
            self.samples.append(spent)
            self.spent += spent

    def median_us(self) -> float | None:
        return 1e6 * statistics.median(self.samples) if self.samples else None


_PROBE_EVERY_S = 0.2


def cell(url: str, mode: str, workers: int, concurrency: int, runs: int, tools: int,
         profile: str | None = None) -> dict[str, Any]:
    _prepare(url, mode, runs)
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, concurrency, tools, barrier, out,
                                                        None if profile is None else f"{profile}-{workers}x{concurrency}")) for _ in range(workers)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    results = [out.get(timeout=900) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    store = open_journal(url)
    try:
        done = sum(1 for cp in store.list_runs(limit=runs + 10) if cp.status == "completed")
    finally:
        store.close()
    taken = sum(r["claimed"] for r in results)
    lost = sum(r["busy"] for r in results)
    calls = sum(r["claim_calls"] for r in results)
    claim_s = sum(r["claim_seconds"] for r in results)
    return {"mode": mode, "shape": f"{workers}x{concurrency}", "runs": runs, "completed": done,
            "attempts": taken + lost + sum(r["claim_stale"] for r in results), "lost": lost,
            "stale": sum(r["claim_stale"] for r in results), "lost_share": lost / max(1, taken + lost + sum(r["claim_stale"] for r in results)),
            "cpu_ms_per_run": 1000 * sum(r["cpu_s"] for r in results) / max(1, done), "wall_s": wall,
            "cpu_ms": 1000 * sum(r["cpu_s"] for r in results),
            "sys_ms_per_run": 1000 * sum(r["sys_s"] for r in results) / max(1, done),
            "claim_calls": calls, "claim_cpu_ms_per_run": 1000 * sum(r["claim_cpu_s"] for r in results) / max(1, done), "claim_ms_per_call": 1000 * claim_s / calls if calls else None,
            "claim_ms_per_run": 1000 * claim_s / max(1, done) if calls else None,
            "errors": sum(r["errors"] for r in results),
            **{f"{k}_per_run": sum(r[k] for r in results) / max(1, done)
               for k in ("groups", "appends", "store_appends", "releases", "acquires", "syscr", "syscw", "rchar",
                         "vcsw", "ivcsw", "pg_waits", "scans")},
            "claims_per_run": calls / max(1, done),
            "empty_claims_per_run": sum(r["claim_empty"] for r in results) / max(1, done),
            "probe_us": statistics.median([r["probe_us"] for r in results if r["probe_us"] is not None] or [0.0])}


_COUNTED = tuple(f"{k}_per_run" for k in ("groups", "appends", "store_appends", "releases", "acquires", "syscr",
                                          "syscw", "rchar", "vcsw", "ivcsw", "claims", "empty_claims", "pg_waits",
                                          "claim_cpu_ms", "sys_ms", "scans"))


def _new_url(backend: str, directory: str, schemas: list[str]) -> str:
    if backend == "sqlite":
        return str(Path(directory) / f"claims-{uuid.uuid4().hex[:8]}.db")
    schema = f"bench_claims_{uuid.uuid4().hex[:10]}"
    schemas.append(schema)
    return f"{PG_URL}?schema={schema}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--tools", type=int, default=4)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--shapes", default="1x32,4x8")
    parser.add_argument("--modes", default="poll,queue,keyed")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pg", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", default=None, help="cProfile each worker into PREFIX-<shape>-<pid>.prof")
    args = parser.parse_args()
    global PG_URL
    PG_URL = args.pg or PG_URL
    schemas: list[str] = []
    cells: list[dict[str, Any]] = []
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as directory:
        try:
            for backend in args.backends.split(","):
                for mode in args.modes.split(","):
                    for shape in args.shapes.split(","):
                        w, c = (int(x) for x in shape.split("x"))
                        found = [cell(_new_url(backend, directory, schemas), mode, w, c, args.runs, args.tools,
                                      args.profile)
                                 for _ in range(args.repeats)]
                        # What the W workers cost with nothing to claim (open the journal, look once,
                        # close): counted in every cell's CPU, spread over its runs. Median of 3.
                        fixed = statistics.median(
                            cell(_new_url(backend, directory, schemas), mode, w, c, 0, args.tools)["cpu_ms"]
                            for _ in range(3))
                        # Medians of CPU and wall time; the claims summed over the repeats.
                        sums = {k: sum(f[k] for f in found) for k in ("runs", "completed", "attempts", "lost",
                                                                       "stale", "errors")}
                        # The per-run counts: medians over the repeats too.
                        counted = {k: statistics.median(f[k] for f in found) for k in _COUNTED}
                        row = dict(found[0], backend=backend, **sums, **counted, lost_share=sums["lost"] / max(1, sums["attempts"]),
                                   cpu_ms_per_run=statistics.median(f["cpu_ms_per_run"] for f in found),
                                   wall_s=statistics.median(f["wall_s"] for f in found),
                                   cpu_ms_per_run_all=[round(f["cpu_ms_per_run"], 1) for f in found],
                                   probe_us=statistics.median(f["probe_us"] for f in found), fixed_ms=fixed,
                                   cpu_ms_per_run_less_fixed=statistics.median(
                                       (f["cpu_ms"] - fixed) / max(1, f["completed"]) for f in found))
                        cells.append(row)
                        print(_line(row), flush=True)
        finally:
            if schemas:
                import psycopg
                from psycopg import sql

                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    for schema in schemas:
                        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for backend in args.backends.split(","):
        for mode in args.modes.split(","):
            one = next((c for c in cells if (c["backend"], c["mode"], c["shape"]) == (backend, mode, "1x32")), None)
            four = next((c for c in cells if (c["backend"], c["mode"], c["shape"]) == (backend, mode, "4x8")), None)
            if one and four:
                ratio = four["cpu_ms_per_run"] / one["cpu_ms_per_run"]
                probe = four["probe_us"] / one["probe_us"] if one["probe_us"] else float("nan")
                less = four["cpu_ms_per_run_less_fixed"] / one["cpu_ms_per_run_less_fixed"]
                print(f"{backend} {mode}: CPU per run 4x8 / 1x32 = {ratio:.2f}; the fixed probe's CPU 4x8 / 1x32 = "
                      f"{probe:.2f} (the same work costing more with four processes on the cores); "
                      f"the ratio at the probe's cost = {ratio / probe:.2f}; less the workers' fixed cost "
                      f"({one['fixed_ms']:.0f} and {four['fixed_ms']:.0f} ms in all) = {less:.2f}")
        for mode in args.modes.split(","):
            eight = next((c for c in cells if (c["backend"], c["mode"], c["shape"]) == (backend, mode, "1x8")), None)
            four = next((c for c in cells if (c["backend"], c["mode"], c["shape"]) == (backend, mode, "4x8")), None)
            if eight and four:  # four processes against one at the same concurrency
                print(f"{backend} {mode}: CPU per run 4x8 / 1x8 = {four['cpu_ms_per_run'] / eight['cpu_ms_per_run']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=2))
    return 0


def _line(c: dict[str, Any]) -> str:
    per_call = f"{c['claim_ms_per_call']:.2f}" if c["claim_ms_per_call"] is not None else "-"
    per_run = f"{c['claim_ms_per_run']:.2f}" if c["claim_ms_per_run"] is not None else "-"
    return (f"{c['backend']:8} {c['mode']:6} {c['shape']:5} runs {c['completed']}/{c['runs']}  attempts "
            f"{c['attempts']:4}  lost {c['lost']:4} ({100 * c['lost_share']:.1f}%), stale {c['stale']}  CPU/run {c['cpu_ms_per_run']:6.1f} ms"
            f" {c.get('cpu_ms_per_run_all', '')}  wall {c['wall_s']:5.1f} s  claim {per_call} ms/call, {per_run} ms/run"
            f"  probe {c['probe_us']:.0f} us  errors {c['errors']}"
            f"  fixed {c.get('fixed_ms', 0):.0f} ms, CPU/run less it {c.get('cpu_ms_per_run_less_fixed', 0):.1f} ms"
            f"\n    per run: group txns {c['groups_per_run']:.2f} ({c['appends_per_run']:.1f} appends), own appends "
            f"{c['store_appends_per_run']:.2f}, releases {c['releases_per_run']:.2f}, acquires {c['acquires_per_run']:.2f}, "
            f"claims {c['claims_per_run']:.3f} ({c['empty_claims_per_run']:.3f} taking nothing), scans of the open runs "
            f"and schedules {c['scans_per_run']:.3f}"
            f"\n    per run: read calls {c['syscr_per_run']:.1f} ({c['rchar_per_run'] / 1024:.1f} KiB), write calls "
            f"{c['syscw_per_run']:.1f}, context switches {c['vcsw_per_run']:.1f} voluntary, {c['ivcsw_per_run']:.1f} not, "
            f"PostgreSQL exchanges {c['pg_waits_per_run']:.1f}; the claim's thread CPU {c['claim_cpu_ms_per_run']:.2f} ms, "
            f"system CPU {c['sys_ms_per_run']:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
