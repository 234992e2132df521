"""A test double that behaves like a .NET 10 runtime towards diagnostic tools.

Written from the protocol documentation (docs/protocol/diagnostic-ipc.md), independently of
tracer's own code, so tests exercise tracer against the documented behaviour:

* start-up, in the runtime's order: bind + listen on `$TMPDIR/dotnet-diagnostic-<pid>-<key>-socket`
  (mode 0600, key = field 22 of /proc/self/stat), THEN `memfd_create("dotnet_ipc_created")` + mmap;
* a single-threaded diagnostic server without read timeouts (like the runtime): ProcessInfo,
  ProcessInfo2, ProcessInfo3, CollectTracing..CollectTracing5 (streaming nettrace V4 framing, and
  CT5 session_type 1 = user_events), StopTracing; anything else → UNKNOWN_COMMAND;
* user_events sessions: receives the `user_events_data` fd over SCM_RIGHTS BEFORE replying,
  registers `<name> u8 version; u16 event_id; __rel_loc u8[] extension; __rel_loc u8[] payload`
  (enable_bit 31, enable_size 4), writes Tracepoint Format V1 records with writev only while the
  kernel has set bit 31, sends metadata only on an event's first write, and unregisters when the
  client closes the connection (polled every 100 ms).

stdout: `READY <pid> <socket path>`; `SESSION_STARTED <id> streaming|user_events`;
`SESSION_ENDED <id>`; replies to commands. stdin commands:
  `gc N`    one GCStart (reason Induced) + GCEnd per GC into every session → `GC_DONE N <total>`
  `emit N`  N `TestDouble/Tick` EventSource events (fields: Int32 Sequence, String Message)
            → `EMITTED N <written> <skipped_disabled>`
  `threads K N`  K new threads (a thread pool's workers) each write N `Tick` events (Message
            `thread <i> tick <k>`) and end; once all have ended
            → `THREADS_EMITTED <written> <tid of each thread>...`
  `counters N` N `TestDouble/EventCounters` events shaped like the runtime's (one object field
            `Payload` {String Name, Double Mean, String DisplayUnits}) for N distinct counters
            `c0`..`c<N-1>` with Mean k and no units — as many series as a hostile peer likes
            → `COUNTERS N <written>`
  `sessions` → `SESSIONS <active>`;  `exit` / EOF → exit 0.
  `amplify ID E N` HOSTILE: into streaming session ID (hex), whatever it requested,
            metadata for `Amplifier/EmptyFields` (V1: 1 024 fields, each an object without
            fields, 16-character names) and for an `Amplifier` event whose name is
            1 000 U+0001 characters, then E empty-payload EmptyFields events and N
            empty-payload events of the long-named one (2 bytes each after the first)
            → `AMPLIFIED <events> <bytes sent on the session's stream so far>`
  `forge N`  HOSTILE: through the fd of each of its user_events sessions, N
            `Tick` records (Message `forged <k>`, with metadata) into every write index 0..63,
            enabled or not, whoever they belong to → `FORGED <writes that succeeded>`
  `ue_amplify N` HOSTILE: into each user_events session's TestDouble tracepoint,
            a record of event 9 whose metadata names it with 1 000 U+0001 characters, then
            N-1 more of event 9 without metadata or payload, each while the tracepoint is
            enabled → `UE_AMPLIFIED <records written>`
  `pin N`   HOSTILE: registers N more tracepoints `pin_<pid>_<k>` through the
            fd of each of its user_events sessions and keeps them → `PINNED <registered>`
  `fork_write N` HOSTILE: a forked child (another process, kept alive until exit) writes N
            `Tick` records (Message `foreign <k>`) into each session's TestDouble tracepoint
            through the inherited fd → `FORK_WROTE <writes> <child pid>`
Environment: DOUBLE_IPC_MEMFD=0 skips the dotnet_ipc_created mapping (socket only).
  DOUBLE_VERSION=V          the version ProcessInfo2/3 report (default 10.0.0+test-double);
                           from 11 on, CollectTracing6 (0x0207) is known: the CT5 streaming
                           payload then `uint sessionBufferMode` (0 drop, 1 block; others →
                           BAD_ENCODING), printed as `SESSION_STARTED <id> streaming <mode>`.
  DOUBLE_STREAM_COPY_DIR=D  every byte sent on a streaming session is also written to
                           D/<session id in hex>.sent (what a tee of the socket would see).
  DOUBLE_LISTEN_ON_LINE=1  after bind(), prints `BOUND <pid> <path>` and listens only once a
                           stdin line arrives (a runtime between bind and listen).
  DOUBLE_HAND_OFF=1        HOSTILE: once listening, forks a child that takes over the listener
                           as uid/gid 65534 and serves every session (this process serves none),
                           writing a `Tick` (Message `forged <k>`) into each every 20 ms for as
                           long as it runs; prints `HANDED_OFF <child pid>` after READY. This
                           process then only reads stdin (`exit` ends it; the child lives on
                           until killed).
Hostile modes (for tracer's hostile-peer tests; a real runtime does neither):
  DOUBLE_IGNORE_STOP=1         StopTracing is read but never answered, the stream never ended;
  DOUBLE_ALL_PROVIDERS=1       streaming sessions get every event, asked for or not;
  DOUBLE_SILENT_STREAM=1       a streaming session is accepted, but its stream never starts.
"""
import ctypes
import mmap
import os
import socket
import struct
import sys
import threading
import time

MAGIC = b"DOTNET_IPC_V1\0"
HEADER = struct.Struct("<14sHBBH")
UNKNOWN_COMMAND = 0x80131385
BAD_ENCODING = 0x80131384
E_FAIL = 0x80004005
RUNTIME_PROVIDER = "Microsoft-Windows-DotNETRuntime"
DOUBLE_PROVIDER = "TestDouble"
DIAG_IOCSREG = 0xC0082A00
DIAG_IOCSUNREG = 0x40082A02
TRACEPOINT_FIELDS = "u8 version; u16 event_id; __rel_loc u8[] extension; __rel_loc u8[] payload"

out_lock = threading.Lock()
IGNORE_STOP = os.environ.get("DOUBLE_IGNORE_STOP") == "1"
ALL_PROVIDERS = os.environ.get("DOUBLE_ALL_PROVIDERS") == "1"
SILENT_STREAM = os.environ.get("DOUBLE_SILENT_STREAM") == "1"
VERSION = os.environ.get("DOUBLE_VERSION", "10.0.0+test-double")
# CollectTracing6 (its buffering mode) exists from .NET 11 on.
HAS_COLLECT_TRACING6 = int(VERSION.split(".")[0]) >= 11
BUFFERING_MODES = {0: "drop", 1: "block"}


def say(*words):
    with out_lock:
        print(*words, flush=True)


def disambiguation_key():
    stat = open("/proc/self/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def utf16z(s):
    return (s + "\0").encode("utf-16-le")


def ipc_string(s):
    return struct.pack("<I", len(s) + 1) + utf16z(s)


def ok_reply(payload):
    return HEADER.pack(MAGIC, 20 + len(payload), 0xFF, 0x00, 0) + payload


def error_reply(hresult):
    return HEADER.pack(MAGIC, 24, 0xFF, 0xFF, 0) + struct.pack("<I", hresult)


class Reader:
    """Payload parser with the runtime's rules (strings must be NUL-terminated and in bounds)."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError("truncated payload")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u8(self):
        return self.take(1)[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        n = self.u32()
        if n == 0:
            return ""
        raw = self.take(2 * n)
        if raw[-2:] != b"\0\0":
            raise ValueError("string without terminator")
        return raw[:-2].decode("utf-16-le")

    def u32_array(self):
        return [self.u32() for _ in range(self.u32())]


def varuint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class Metadata:
    def __init__(self, provider, event_id, name, keywords, version, level, fields):
        self.provider, self.event_id, self.name = provider, event_id, name
        self.keywords, self.version, self.level, self.fields = keywords, version, level, fields

    def body(self):
        """NetTrace metadata body without the leading MetadataId."""
        b = utf16z(self.provider) + struct.pack("<I", self.event_id) + utf16z(self.name)
        b += struct.pack("<qIII", self.keywords, self.version, self.level, len(self.fields))
        for type_code, field_name in self.fields:
            b += struct.pack("<I", type_code) + utf16z(field_name)
        return b


class ObjectFieldMetadata(Metadata):
    """Metadata whose only field is an object of (type code, name) fields (EventCounters)."""

    def __init__(self, provider, event_id, name, object_name, object_fields):
        super().__init__(provider, event_id, name, 0x0, 0, 0, [])
        self.object_name, self.object_fields = object_name, object_fields

    def body(self):
        # The field count (0) is replaced by 1: an Object (type code 1) with its own fields.
        b = super().body()[:-4] + struct.pack("<I", 1)
        b += struct.pack("<II", 1, len(self.object_fields))
        for type_code, field_name in self.object_fields:
            b += struct.pack("<I", type_code) + utf16z(field_name)
        return b + utf16z(self.object_name)


GC_START = Metadata(RUNTIME_PROVIDER, 1, "", 0x1, 2, 4, [])
GC_END = Metadata(RUNTIME_PROVIDER, 2, "", 0x1, 1, 4, [])
TICK = Metadata(DOUBLE_PROVIDER, 1, "Tick", 0x0, 0, 4, [(9, "Sequence"), (18, "Message")])
# String = 18, Double = 14 (TypeCode).
COUNTERS = ObjectFieldMetadata(DOUBLE_PROVIDER, 2, "EventCounters", "Payload",
                               [(18, "Name"), (14, "Mean"), (18, "DisplayUnits")])


def gc_start_payload(count):
    # GCStart V2: Count, Depth, Reason (1 = Induced), Type, ClrInstanceID, ClientSequenceNumber.
    return struct.pack("<IIIIHQ", count, 2, 1, 0, 0, 0)


def gc_end_payload(count):
    return struct.pack("<IIH", count, 2, 0)


def tick_payload(seq, message=None):
    return struct.pack("<i", seq) + utf16z(message or f"tick {seq}")


def counter_payload(name, mean):
    return utf16z(name) + struct.pack("<d", mean) + utf16z("")


def tick_record(write_index, seq, message):
    """A Tracepoint Format V1 Tick record with its metadata, as writev parts."""
    payload = tick_payload(seq, message)
    meta = TICK.body()
    ext = b"\x01" + struct.pack("<I", len(meta)) + meta
    head = struct.pack("<IBHII", write_index, 1, TICK.event_id, (len(ext) << 16) | 4,
                       (len(payload) << 16) | len(ext))
    return [head, ext, payload]


FORGE_INDICES = 64
children = []
pins = []  # tracepoints registered by `pin`, kept until exit


class Provider:
    def __init__(self, name, keywords, level, filter_enable=None, filter_ids=()):
        self.name, self.keywords, self.level = name, keywords, level
        self.filter_enable, self.filter_ids = filter_enable, list(filter_ids)
        self.tracepoint_default, self.tracepoint_sets = "", []

    def enabled(self, meta):
        # Runtime order: keywords, level, then the event filter (docs/protocol/diagnostic-ipc.md §4.1).
        if meta.keywords and not (meta.keywords & self.keywords):
            return False
        if meta.level and self.level and self.level < meta.level:
            return False
        if self.filter_enable is None:
            return True
        listed = meta.event_id in self.filter_ids
        return listed if self.filter_enable else not listed


def parse_provider(r, with_filter):
    keywords, level, name, _args = r.u64(), r.u32(), r.string(), r.string()
    if not name or level > 5:
        raise ValueError("bad provider")
    p = Provider(name, keywords, level)
    if with_filter:
        enable = r.u8()
        ids = r.u32_array()
        p.filter_enable, p.filter_ids = bool(enable), ids
    return p


class StreamingSession:
    """Writes a nettrace (V4 framing) stream on the client's socket."""

    def __init__(self, sid, conn, providers):
        self.sid, self.conn, self.providers = sid, conn, providers
        copy_dir = os.environ.get("DOUBLE_STREAM_COPY_DIR")
        self.copy = open(os.path.join(copy_dir, f"{sid:x}.sent"), "wb") if copy_dir else None
        self.offset = 0
        self.metadata_ids = {}
        self.seq = 0
        self.thread_id = threading.get_native_id()
        self.lock = threading.Lock()
        self.closed = False

    def start_stream(self):
        """Prologue and Trace object; called (under `lock`) right after the OK reply."""
        self.send(b"Nettrace" + struct.pack("<I", 20) + b"!FastSerialization.1")
        self.send(self.object_start("Trace", 4, 4) + self.trace_payload() + b"\x06")

    def send(self, b):
        """Called under `lock`. Like the runtime, a session whose stream cannot be written any
        more (the client cut or closed it) ends on its own."""
        try:
            self.conn.sendall(b)
        except OSError:
            self.closed = True
            self.conn.close()
            server.session_ended(self)
            raise
        if self.copy:
            self.copy.write(b)
            self.copy.flush()
        self.offset += len(b)

    @staticmethod
    def object_start(name, version, min_version):
        name_b = name.encode()
        return (b"\x05\x05\x01" + struct.pack("<iiI", version, min_version, len(name_b))
                + name_b + b"\x06")

    def trace_payload(self):
        t = time.gmtime()
        now_ns = time.monotonic_ns()
        sync = struct.pack("<8H", t.tm_year, t.tm_mon, (t.tm_wday + 1) % 7, t.tm_mday,
                           t.tm_hour, t.tm_min, t.tm_sec, 0)
        return sync + struct.pack("<qqIIII", now_ns, 1_000_000_000, 8, os.getpid(),
                                  os.cpu_count() or 1, 1_000_000)

    def block(self, name, content):
        self.send(self.block_bytes(name, content, self.offset))

    def block_bytes(self, name, content, offset):
        """Block object `name` as it is written at stream offset `offset`."""
        start = self.object_start(name, 2, 2)
        # BlockSize, then zero padding so the content starts 4-aligned in the stream.
        pos_after_size = offset + len(start) + 4
        pad = (-pos_after_size) % 4
        return start + struct.pack("<I", len(content)) + b"\0" * pad + content + b"\x06"

    @staticmethod
    def blob(flags_fields, payload):
        return flags_fields + varuint(len(payload)) + payload

    def events_block(self, blobs, ts):
        header = struct.pack("<HHqq", 20, 1, ts, ts)
        return header + b"".join(blobs)

    def write_events(self, items):
        """items: list of (Metadata, payload). Metadata goes out before the events using it."""
        with self.lock:
            if self.closed:
                return 0
            selected = [(m, p) for m, p in items
                        if ALL_PROVIDERS
                        or any(pr.name == m.provider and pr.enabled(m) for pr in self.providers)]
            if not selected:
                return 0
            ts = time.monotonic_ns()
            new_meta = []
            for m, _ in selected:
                if id(m) not in self.metadata_ids:
                    self.metadata_ids[id(m)] = len(self.metadata_ids) + 1
                    new_meta.append(m)
            if new_meta:
                blobs = []
                for m in new_meta:
                    payload = struct.pack("<I", self.metadata_ids[id(m)]) + m.body()
                    # Flags: timestamp delta always present + payload size (0x80).
                    blobs.append(bytes([0x80]) + varuint(0) + varuint(len(payload)) + payload)
                self.block("MetadataBlock", self.events_block(blobs, ts))
            blobs = []
            prev_ts = 0
            prev_meta = 0
            prev_seq = 0
            first = True
            for m, p in selected:
                self.seq += 1
                mid = self.metadata_ids[id(m)]
                flags = 0x80 | 0x02  # payload size + sequence/capture thread/proc
                fields = b""
                if mid != prev_meta:
                    flags |= 0x01
                    fields += varuint(mid)
                fields += varuint(self.seq - prev_seq - 1) + varuint(self.thread_id) + varuint(0)
                if first:
                    flags |= 0x04 | 0x40
                    fields += varuint(self.thread_id)
                ev_ts = time.monotonic_ns()
                fields += varuint(ev_ts - prev_ts)
                blobs.append(bytes([flags]) + fields + varuint(len(p)) + p)
                prev_ts, prev_meta, prev_seq, first = ev_ts, mid, self.seq, False
            self.block("EventBlock", self.events_block(blobs, ts))
            return len(selected)

    def amplify(self, empty_events, named_events):
        """The amplifying stream of `amplify E N` (see the module documentation)."""
        with self.lock:
            if self.closed:
                return 0
            ids = [len(self.metadata_ids) + 1, len(self.metadata_ids) + 2]
            self.metadata_ids[("amplify", ids[0])] = ids[0]
            self.metadata_ids[("amplify", ids[1])] = ids[1]
            empty = b"".join(struct.pack("<II", 1, 0) + utf16z(f"EmptyStructField{i % 10}")
                             for i in range(1024))
            empty_meta = Metadata("Amplifier", 1, "EmptyFields", 0, 0, 4, []).body()
            empty_meta = empty_meta[:-4] + struct.pack("<I", 1024) + empty
            long_name = "\x01" * 1000
            named_meta = Metadata("Amplifier", 2, long_name, 0, 0, 4, []).body()
            blobs = []
            for mid, body in zip(ids, [empty_meta, named_meta]):
                payload = struct.pack("<I", mid) + body
                blobs.append(bytes([0x80]) + varuint(0) + varuint(len(payload)) + payload)
            ts = time.monotonic_ns()
            # Every block in one write (it fits the socket's buffer): tracer cuts the stream
            # once the output budget is spent, which it does while reading the first long-named
            # events, and a later write would fail and leave events unsent.
            stream = bytearray()

            def add_block(name, content):
                stream.extend(self.block_bytes(name, content, self.offset + len(stream)))

            add_block("MetadataBlock", self.events_block(blobs, ts))
            for mid, count in zip(ids, [empty_events, named_events]):
                for start in range(0, count, 1000):
                    n = min(1000, count - start)
                    # First: metadata id, thread, payload size 0; then flags 0: same metadata,
                    # next sequence, a timestamp delta, the same (empty) payload size.
                    first = (bytes([0x01 | 0x02 | 0x04 | 0x80]) + varuint(mid) + varuint(self.seq)
                             + varuint(self.thread_id) + varuint(0) + varuint(self.thread_id)
                             + varuint(1) + varuint(0))
                    self.seq += n
                    rest = [b"\x00\x01"] * (n - 1)
                    add_block("EventBlock", self.events_block([first] + rest, ts))
            self.send(bytes(stream))
            return empty_events + named_events

    def stop(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
            ts = time.monotonic_ns()
            sp = struct.pack("<qI", ts, 1) + struct.pack("<QI", self.thread_id, self.seq)
            try:
                self.block("SPBlock", sp)
                self.send(b"\x01")
            except OSError:
                pass  # the stream is gone already
            finally:
                self.conn.close()


class UserEventReg(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("size", ctypes.c_uint32), ("enable_bit", ctypes.c_uint8),
                ("enable_size", ctypes.c_uint8), ("flags", ctypes.c_uint16),
                ("enable_addr", ctypes.c_uint64), ("name_args", ctypes.c_uint64),
                ("write_index", ctypes.c_uint32)]


class UserEventUnreg(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("size", ctypes.c_uint32), ("disable_bit", ctypes.c_uint8),
                ("reserved", ctypes.c_uint8), ("reserved2", ctypes.c_uint16),
                ("disable_addr", ctypes.c_uint64)]


libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


class Tracepoint:
    def __init__(self, fd, name):
        self.name = name
        self.enabled = ctypes.c_uint32(0)
        self.args = ctypes.create_string_buffer(f"{name} {TRACEPOINT_FIELDS}".encode())
        reg = UserEventReg(28, 31, 4, 0, ctypes.addressof(self.enabled),
                           ctypes.addressof(self.args), 0)
        if libc.ioctl(fd, DIAG_IOCSREG, ctypes.byref(reg)) != 0:
            raise OSError(ctypes.get_errno(), f"DIAG_IOCSREG {name}")
        self.write_index = reg.write_index

    def is_enabled(self):
        return bool(self.enabled.value & (1 << 31))

    def unregister(self, fd):
        unreg = UserEventUnreg(16, 31, 0, 0, ctypes.addressof(self.enabled))
        if libc.ioctl(fd, DIAG_IOCSUNREG, ctypes.byref(unreg)) != 0:
            say("ERROR DIAG_IOCSUNREG", self.name, ctypes.get_errno())


class UserEventsSession:
    def __init__(self, sid, conn, fd, providers):
        self.sid, self.conn, self.fd, self.providers = sid, conn, fd, providers
        self.lock = threading.Lock()
        self.closed = False
        self.meta_sent = set()
        self.tracepoints = {}  # name -> Tracepoint
        for p in providers:
            for tp_name in [p.tracepoint_default] + [n for n, _ in p.tracepoint_sets]:
                if tp_name and tp_name not in self.tracepoints:
                    self.tracepoints[tp_name] = Tracepoint(fd, tp_name)
        threading.Thread(target=self.watch_peer, daemon=True).start()

    def tracepoint_for(self, provider, event_id):
        for name, ids in provider.tracepoint_sets:
            if event_id in ids:
                return self.tracepoints[name]
        return self.tracepoints.get(provider.tracepoint_default)

    def write_events(self, items):
        written = skipped = 0
        with self.lock:
            if self.closed:
                return 0, 0
            for m, payload in items:
                provider = next((p for p in self.providers
                                 if p.name == m.provider and p.enabled(m)), None)
                if provider is None:
                    continue
                tp = self.tracepoint_for(provider, m.event_id)
                if tp is None:
                    continue
                if not tp.is_enabled():
                    skipped += 1
                    continue
                ext = b""
                # Native runtime events never carry metadata; EventSource events only on first write.
                if m.provider != RUNTIME_PROVIDER and id(m) not in self.meta_sent:
                    meta = m.body()  # provider name first (dotnet/runtime PR #118294)
                    ext = b"\x01" + struct.pack("<I", len(meta)) + meta
                    self.meta_sent.add(id(m))
                head = struct.pack("<IBHII", tp.write_index, 1, m.event_id & 0xFFFF,
                                   (len(ext) << 16) | 4, (len(payload) << 16) | len(ext))
                os.writev(self.fd, [head, ext, payload])
                written += 1
        return written, skipped

    def amplify(self, n):
        """The records of `ue_amplify N` (see the module documentation); returns those written."""
        provider = next((p for p in self.providers if p.name == DOUBLE_PROVIDER), None)
        if provider is None:
            return 0
        tp = self.tracepoints[provider.tracepoint_default]
        meta = Metadata(DOUBLE_PROVIDER, 9, "\x01" * 1000, 0, 0, 4, []).body()
        ext = b"\x01" + struct.pack("<I", len(meta)) + meta
        written = 0
        with self.lock:
            for k in range(n):
                if self.closed or not tp.is_enabled():
                    break
                part = ext if k == 0 else b""
                head = struct.pack("<IBHII", tp.write_index, 1, 9, (len(part) << 16) | 4,
                                   len(part))
                try:
                    os.writev(self.fd, [head, part])
                except OSError:
                    break
                written += 1
        return written

    def watch_peer(self):
        # The runtime polls the continuation socket about every 100 ms and ends the session when
        # the client has closed it (dotnet/runtime PR #117435).
        while True:
            try:
                data = self.conn.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
                if data == b"":
                    break
            except BlockingIOError:
                pass
            except OSError:
                break
            time.sleep(0.1)
        self.stop()

    def stop(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for tp in self.tracepoints.values():
                tp.unregister(self.fd)
            os.close(self.fd)
            self.conn.close()
        server.session_ended(self)


class Server:
    def __init__(self):
        self.sessions = {}
        self.lock = threading.Lock()
        self.next_id = 0x7F00_0000_1000
        self.gc_count = 0
        self.tick_seq = 0
        self.cookie = os.urandom(16)
        self.unanswered = []

    def new_session_id(self):
        with self.lock:
            self.next_id += 0x100
            return self.next_id

    def user_events_sessions(self):
        with self.lock:
            return [s for s in self.sessions.values() if isinstance(s, UserEventsSession)]

    def session_ended(self, session):
        with self.lock:
            present = self.sessions.pop(session.sid, None)
        if present is not None:
            say("SESSION_ENDED", hex(session.sid))

    def serve(self, listener):
        # One thread per connection: every tracer on the host (tests run in parallel) may talk
        # to this double, and a client slow to send its command must not hold up the others.
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self.serve_one, args=(conn,), daemon=True).start()

    def serve_one(self, conn):
        try:
            self.handle(conn)
        except Exception as e:  # a broken client must not stop the server
            say("CLIENT_ERROR", repr(e))
            conn.close()

    @staticmethod
    def recv_exact(conn, n):
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("client closed mid-message")
            buf += chunk
        return buf

    def handle(self, conn):
        magic, size, cset, cid, _ = HEADER.unpack(self.recv_exact(conn, 20))
        if magic != MAGIC:
            conn.sendall(error_reply(0x80131386))
            conn.close()
            return
        if size < 20:
            conn.sendall(error_reply(BAD_ENCODING))
            conn.close()
            return
        payload = self.recv_exact(conn, size - 20)
        say("COMMAND", f"{cset:02x}{cid:02x}")
        if cset == 0x04 and cid in (0x00, 0x04, 0x08):
            conn.sendall(ok_reply(self.process_info(cid)))
            conn.close()
        elif cset == 0x02 and cid == 0x01:
            sid = Reader(payload).u64()
            with self.lock:
                session = self.sessions.get(sid)
            if session is None:
                conn.sendall(error_reply(BAD_ENCODING))
                conn.close()
                return
            if IGNORE_STOP:
                self.unanswered.append(conn)  # the connection stays open, unanswered
                return
            # Like the runtime: the session is disabled (its stream flushed to the end, which
            # waits for a writer blocked on a full socket) before StopTracing is answered.
            session.stop()
            self.session_ended(session)
            conn.sendall(ok_reply(struct.pack("<Q", sid)))
            conn.close()
        elif cset == 0x02 and (cid in (0x02, 0x03, 0x04, 0x05, 0x06)
                               or (cid == 0x07 and HAS_COLLECT_TRACING6)):
            self.collect_tracing(conn, cid, Reader(payload))
        else:
            conn.sendall(error_reply(UNKNOWN_COMMAND))
            conn.close()

    def process_info(self, cid):
        body = struct.pack("<Q", os.getpid()) + self.cookie
        body += ipc_string(" ".join([sys.executable] + sys.argv)) + ipc_string("Linux")
        body += ipc_string("x64")
        if cid in (0x04, 0x08):
            body += ipc_string("TestDouble") + ipc_string(VERSION)
        if cid == 0x08:
            body = struct.pack("<I", 1) + body + ipc_string("linux-x64")
        return body

    def collect_tracing(self, conn, cid, r):
        mode = None
        try:
            if cid in (0x06, 0x07):
                session_type = r.u32()
                if session_type == 1:
                    return self.start_user_events(conn, r)
                if session_type != 0:
                    raise ValueError("bad session type")
                buffer_mb, fmt, _rundown_kw, _stack = r.u32(), r.u32(), r.u64(), r.u8()
            else:
                buffer_mb, fmt = r.u32(), r.u32()
                if cid == 0x03:
                    r.u8()
                elif cid == 0x04:
                    r.u8(), r.u8()
                elif cid == 0x05:
                    r.u64(), r.u8()
            count = r.u32()
            if buffer_mb == 0 or fmt != 1 or not 1 <= count <= 1000:
                raise ValueError("bad session parameters")
            providers = [parse_provider(r, cid in (0x06, 0x07)) for _ in range(count)]
            if cid == 0x07:
                mode = BUFFERING_MODES.get(r.u32())
                if mode is None:
                    raise ValueError("bad sessionBufferMode")
        except ValueError:
            conn.sendall(error_reply(BAD_ENCODING))
            conn.close()
            return
        sid = self.new_session_id()
        session = StreamingSession(sid, conn, providers)
        # Like the runtime (ep_enable before the reply), the session is live before the client
        # learns its id: an event fired right after the reply must reach it.
        with session.lock:
            with self.lock:
                self.sessions[sid] = session
            conn.sendall(ok_reply(struct.pack("<Q", sid)))
            if not SILENT_STREAM:
                session.start_stream()
        say("SESSION_STARTED", hex(sid), "streaming", *([mode] if mode else []))

    def start_user_events(self, conn, r):
        try:
            _rundown_kw = r.u64()
            providers = []
            for _ in range(r.u32()):
                p = parse_provider(r, True)
                p.tracepoint_default = r.string()
                for _ in range(r.u32()):
                    name, ids = r.string(), r.u32_array()
                    if not name or not ids:
                        raise ValueError("empty tracepoint set")
                    p.tracepoint_sets.append((name, ids))
                if not p.tracepoint_default and not p.tracepoint_sets:
                    raise ValueError("no tracepoint")
                providers.append(p)
            if not providers:
                raise ValueError("no providers")
        except ValueError:
            conn.sendall(error_reply(BAD_ENCODING))
            conn.close()
            return
        # The fd arrives after the command (a separate 1-byte message with SCM_RIGHTS).
        msg, fds, _flags, _addr = socket.recv_fds(conn, 1, 1)
        if len(fds) != 1:
            conn.sendall(error_reply(BAD_ENCODING))
            conn.close()
            return
        sid = self.new_session_id()
        try:
            session = UserEventsSession(sid, conn, fds[0], providers)
        except OSError as e:
            say("REGISTER_FAILED", e.errno)
            os.close(fds[0])
            conn.sendall(error_reply(E_FAIL))
            conn.close()
            return
        with self.lock:
            self.sessions[sid] = session
        conn.sendall(ok_reply(struct.pack("<Q", sid)))
        say("SESSION_STARTED", hex(sid), "user_events")

    def broadcast(self, items):
        with self.lock:
            sessions = list(self.sessions.values())
        written = skipped = 0
        for s in sessions:
            try:
                result = s.write_events(items)
            except OSError:
                continue
            if isinstance(result, tuple):
                written += result[0]
                skipped += result[1]
            else:
                written += result
        return written, skipped


server = Server()


def serve_handed_off(listener):
    """DOUBLE_HAND_OFF's child: the listener's new holder, another user, serving forever."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    # Codecs load on first use, from where uid 65534 may not read.
    utf16z("")
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)

    def tick():
        while True:
            server.tick_seq += 1
            seq = server.tick_seq
            server.broadcast([(TICK, tick_payload(seq, f"forged {seq}"))])
            time.sleep(0.02)

    threading.Thread(target=tick, daemon=True).start()
    server.serve(listener)


def main():
    tmpdir = os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(tmpdir, f"dotnet-diagnostic-{os.getpid()}-{disambiguation_key()}-socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    os.fchmod(listener.fileno(), 0o600)
    listener.bind(path)
    if os.environ.get("DOUBLE_LISTEN_ON_LINE") == "1":
        say("BOUND", os.getpid(), path)
        sys.stdin.readline()
    listener.listen(255)
    if os.environ.get("DOUBLE_IPC_MEMFD", "1") != "0":
        # After the listen socket exists, like ds_ipc_stream_factory_configure.
        memfd = os.memfd_create("dotnet_ipc_created", os.MFD_CLOEXEC)
        os.ftruncate(memfd, mmap.PAGESIZE)
        marker = mmap.mmap(memfd, mmap.PAGESIZE, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        os.close(memfd)
        globals()["_marker"] = marker  # keep the mapping alive
    # READY first: the socket already listens (clients queue in the backlog), and a client's
    # COMMAND line must not come out before it.
    if os.environ.get("DOUBLE_HAND_OFF") == "1":
        # Forked before any thread starts; the child never returns.
        handler = os.fork()
        if handler == 0:
            serve_handed_off(listener)
        listener.close()
        say("READY", os.getpid(), path)
        say("HANDED_OFF", handler)
    else:
        say("READY", os.getpid(), path)
        threading.Thread(target=server.serve, args=(listener,), daemon=True).start()
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "gc":
                n = int(cmd[1])
                items = []
                for _ in range(n):
                    server.gc_count += 1
                    items.append((GC_START, gc_start_payload(server.gc_count)))
                    items.append((GC_END, gc_end_payload(server.gc_count)))
                server.broadcast(items)
                say("GC_DONE", n, server.gc_count)
            elif cmd[0] == "emit":
                n = int(cmd[1])
                items = []
                for _ in range(n):
                    server.tick_seq += 1
                    items.append((TICK, tick_payload(server.tick_seq)))
                written, skipped = server.broadcast(items)
                say("EMITTED", n, written, skipped)
            elif cmd[0] == "threads":
                k, n = int(cmd[1]), int(cmd[2])
                tids, written = [0] * k, [0] * k

                def write(i):
                    tids[i] = threading.get_native_id()
                    items = [(TICK, tick_payload(j + 1, f"thread {i} tick {j + 1}"))
                             for j in range(n)]
                    written[i] = server.broadcast(items)[0]

                workers = [threading.Thread(target=write, args=(i,)) for i in range(k)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                say("THREADS_EMITTED", sum(written), *tids)
            elif cmd[0] == "counters":
                n = int(cmd[1])
                items = [(COUNTERS, counter_payload(f"c{k}", float(k))) for k in range(n)]
                written, _ = server.broadcast(items)
                say("COUNTERS", n, written)
            elif cmd[0] == "amplify":
                with server.lock:
                    target = server.sessions.get(int(cmd[1], 16))
                events = 0
                if isinstance(target, StreamingSession):
                    try:
                        events = target.amplify(int(cmd[2]), int(cmd[3]))
                    except OSError:
                        pass
                say("AMPLIFIED", events, target.offset if target else 0)
            elif cmd[0] == "forge":
                n = int(cmd[1])
                fds = [s.fd for s in server.user_events_sessions()]
                ok = 0
                for fd in fds:
                    for index in range(FORGE_INDICES):
                        for k in range(n):
                            try:
                                os.writev(fd, tick_record(index, k + 1, f"forged {k + 1}"))
                                ok += 1
                            except OSError:
                                pass
                say("FORGED", ok)
            elif cmd[0] == "fork_write":
                n = int(cmd[1])
                targets = [(s.fd, s.tracepoints[p.tracepoint_default].write_index)
                           for s in server.user_events_sessions()
                           for p in s.providers
                           if p.name == DOUBLE_PROVIDER and p.tracepoint_default]
                r, w = os.pipe()
                child = os.fork()
                if child == 0:
                    ok = 0
                    for fd, index in targets:
                        for k in range(n):
                            try:
                                os.writev(fd, tick_record(index, k + 1, f"foreign {k + 1}"))
                                ok += 1
                            except OSError:
                                pass
                    os.write(w, f"{ok}\n".encode())
                    time.sleep(300)
                    os._exit(0)
                os.close(w)
                ok = int(os.read(r, 64).decode().strip())
                os.close(r)
                children.append(child)
                say("FORK_WROTE", ok, child)
                with server.lock:
                    say("SESSIONS", len(server.sessions))
            elif cmd[0] == "ue_amplify":
                n = int(cmd[1])
                say("UE_AMPLIFIED", sum(s.amplify(n) for s in server.user_events_sessions()))
            elif cmd[0] == "pin":
                n = int(cmd[1])
                pinned = 0
                for s in server.user_events_sessions():
                    for k in range(n):
                        try:
                            pins.append(Tracepoint(s.fd, f"pin_{os.getpid()}_{k}"))
                            pinned += 1
                        except OSError:
                            break
                say("PINNED", pinned)
            elif cmd[0] == "exit":
                break
            else:
                say("ERROR unknown command", cmd[0])
    finally:
        for child in children:
            os.kill(child, 9)
            os.waitpid(child, 0)
        os.unlink(path)


if __name__ == "__main__":
    main()
