//! Built-in payload layouts of native runtime events (provider `Microsoft-Windows-DotNETRuntime`),
//! which carry no field metadata. Layouts follow the public ClrEtwAll.man templates
//! (docs/protocol/nettrace.md §10.2) and were checked against payloads captured from CoreCLR 8.0.4.

pub const RUNTIME_PROVIDER: &str = "Microsoft-Windows-DotNETRuntime";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    U16,
    U32,
    U64,
    F64,
    /// Pointer-sized (Trace object PointerSize).
    Pointer,
    Utf16Z,
}

#[derive(Debug)]
pub struct RuntimeField {
    pub name: &'static str,
    pub kind: Kind,
    /// Manifest value map naming the integer values.
    pub map: Option<fn(u64) -> Option<&'static str>>,
}

/// One native event with its template versions, oldest first.
#[derive(Debug)]
pub struct RuntimeEvent {
    pub id: u32,
    pub name: &'static str,
    versions: &'static [(u32, &'static [RuntimeField])],
}

impl RuntimeEvent {
    /// Layouts to try: the newest template not newer than `version`, or — when the version was
    /// not transmitted (user_events) — every template newest first, so the first that fits the
    /// payload wins.
    pub(crate) fn layouts_for(
        &self,
        version: Option<u32>,
    ) -> impl Iterator<Item = &'static [RuntimeField]> {
        let versions = self.versions;
        let chosen = version
            .map(|v| versions.iter().rev().find(|(tv, _)| *tv <= v).unwrap_or(&versions[0]).1);
        let all = versions.iter().rev().map(|(_, fields)| *fields);
        chosen.into_iter().chain(all.filter(move |_| chosen.is_none()))
    }
}

/// Events are identified by their id (the table holds each id once).
impl PartialEq for RuntimeEvent {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

pub fn lookup(provider: &str, event_id: u32) -> Option<&'static RuntimeEvent> {
    if provider != RUNTIME_PROVIDER {
        return None;
    }
    EVENTS.iter().find(|e| e.id == event_id)
}

const fn field(name: &'static str, kind: Kind) -> RuntimeField {
    RuntimeField { name, kind, map: None }
}

const fn mapped(
    name: &'static str,
    kind: Kind,
    map: fn(u64) -> Option<&'static str>,
) -> RuntimeField {
    RuntimeField { name, kind, map: Some(map) }
}

use Kind::*;

fn gc_reason(v: u64) -> Option<&'static str> {
    const NAMES: [&str; 10] = [
        "AllocSmall",
        "Induced",
        "LowMemory",
        "Empty",
        "AllocLarge",
        "OutOfSpaceSOH",
        "OutOfSpaceLOH",
        "InducedNotForced",
        "Internal",
        "InducedLowMemory",
    ];
    NAMES.get(usize::try_from(v).ok()?).copied()
}

fn gc_type(v: u64) -> Option<&'static str> {
    ["NonConcurrentGC", "BackgroundGC", "ForegroundGC"].get(usize::try_from(v).ok()?).copied()
}

fn allocation_kind(v: u64) -> Option<&'static str> {
    ["Small", "Large", "Pinned"].get(usize::try_from(v).ok()?).copied()
}

fn thread_adjustment_reason(v: u64) -> Option<&'static str> {
    const NAMES: [&str; 8] = [
        "Warmup",
        "Initializing",
        "RandomMove",
        "ClimbingMove",
        "ChangePoint",
        "Stabilizing",
        "Starvation",
        "ThreadTimedOut",
    ];
    NAMES.get(usize::try_from(v).ok()?).copied()
}

// A newer template version only appends fields: older versions are prefixes of the newest.
const GC_START_V2: &[RuntimeField] = &[
    field("Count", U32),
    field("Depth", U32),
    mapped("Reason", U32, gc_reason),
    mapped("Type", U32, gc_type),
    field("ClrInstanceID", U16),
    field("ClientSequenceNumber", U64),
];
const GC_START_V1: &[RuntimeField] = GC_START_V2.split_at(5).0;
const GC_END_V1: &[RuntimeField] =
    &[field("Count", U32), field("Depth", U32), field("ClrInstanceID", U16)];

const CLR_INSTANCE_ONLY: &[RuntimeField] = &[field("ClrInstanceID", U16)];
const GC_SUSPEND_EE_BEGIN_V1: &[RuntimeField] =
    &[field("Reason", U32), field("Count", U32), field("ClrInstanceID", U16)];
const GC_TRIGGERED_V1: &[RuntimeField] =
    &[mapped("Reason", U32, gc_reason), field("ClrInstanceID", U16)];

const GC_HEAP_STATS_V2: &[RuntimeField] = &[
    field("GenerationSize0", U64),
    field("TotalPromotedSize0", U64),
    field("GenerationSize1", U64),
    field("TotalPromotedSize1", U64),
    field("GenerationSize2", U64),
    field("TotalPromotedSize2", U64),
    field("GenerationSize3", U64),
    field("TotalPromotedSize3", U64),
    field("FinalizationPromotedSize", U64),
    field("FinalizationPromotedCount", U64),
    field("PinnedObjectCount", U32),
    field("SinkBlockCount", U32),
    field("GCHandleCount", U32),
    field("ClrInstanceID", U16),
    field("GenerationSize4", U64),
    field("TotalPromotedSize4", U64),
];
const GC_HEAP_STATS_V1: &[RuntimeField] = GC_HEAP_STATS_V2.split_at(14).0;

const GC_ALLOCATION_TICK_V4: &[RuntimeField] = &[
    field("AllocationAmount", U32),
    mapped("AllocationKind", U32, allocation_kind),
    field("ClrInstanceID", U16),
    field("AllocationAmount64", U64),
    field("TypeID", Pointer),
    field("TypeName", Utf16Z),
    field("HeapIndex", U32),
    field("Address", Pointer),
    field("ObjectSize", U64),
];
const GC_ALLOCATION_TICK_V3: &[RuntimeField] = GC_ALLOCATION_TICK_V4.split_at(8).0;
const GC_ALLOCATION_TICK_V2: &[RuntimeField] = GC_ALLOCATION_TICK_V4.split_at(7).0;

const EXCEPTION_THROWN_V1: &[RuntimeField] = &[
    field("ExceptionType", Utf16Z),
    field("ExceptionMessage", Utf16Z),
    field("ExceptionEIP", Pointer),
    field("ExceptionHRESULT", U32),
    field("ExceptionFlags", U16),
    field("ClrInstanceID", U16),
];

const THREAD_ADJUSTMENT_SAMPLE: &[RuntimeField] =
    &[field("Throughput", F64), field("ClrInstanceID", U16)];
const THREAD_ADJUSTMENT_ADJUSTMENT: &[RuntimeField] = &[
    field("AverageThroughput", F64),
    field("NewWorkerThreadCount", U32),
    mapped("Reason", U32, thread_adjustment_reason),
    field("ClrInstanceID", U16),
];
const THREAD_ADJUSTMENT_STATS: &[RuntimeField] = &[
    field("Duration", F64),
    field("Throughput", F64),
    field("ThreadWave", F64),
    field("ThroughputWave", F64),
    field("ThroughputErrorEstimate", F64),
    field("AverageThroughputErrorEstimate", F64),
    field("ThroughputRatio", F64),
    field("Confidence", F64),
    field("NewControlSetting", F64),
    field("NewThreadWaveMagnitude", U16),
    field("ClrInstanceID", U16),
];

static EVENTS: &[RuntimeEvent] = &[
    RuntimeEvent { id: 1, name: "GCStart", versions: &[(1, GC_START_V1), (2, GC_START_V2)] },
    RuntimeEvent { id: 2, name: "GCEnd", versions: &[(1, GC_END_V1)] },
    RuntimeEvent { id: 3, name: "GCRestartEEEnd", versions: &[(1, CLR_INSTANCE_ONLY)] },
    RuntimeEvent {
        id: 4,
        name: "GCHeapStats",
        versions: &[(1, GC_HEAP_STATS_V1), (2, GC_HEAP_STATS_V2)],
    },
    RuntimeEvent { id: 7, name: "GCRestartEEBegin", versions: &[(1, CLR_INSTANCE_ONLY)] },
    RuntimeEvent { id: 8, name: "GCSuspendEEEnd", versions: &[(1, CLR_INSTANCE_ONLY)] },
    RuntimeEvent { id: 9, name: "GCSuspendEEBegin", versions: &[(1, GC_SUSPEND_EE_BEGIN_V1)] },
    RuntimeEvent {
        id: 10,
        name: "GCAllocationTick",
        versions: &[
            (2, GC_ALLOCATION_TICK_V2),
            (3, GC_ALLOCATION_TICK_V3),
            (4, GC_ALLOCATION_TICK_V4),
        ],
    },
    RuntimeEvent { id: 35, name: "GCTriggered", versions: &[(1, GC_TRIGGERED_V1)] },
    RuntimeEvent {
        id: 54,
        name: "ThreadPoolWorkerThreadAdjustmentSample",
        versions: &[(0, THREAD_ADJUSTMENT_SAMPLE)],
    },
    RuntimeEvent {
        id: 55,
        name: "ThreadPoolWorkerThreadAdjustmentAdjustment",
        versions: &[(0, THREAD_ADJUSTMENT_ADJUSTMENT)],
    },
    RuntimeEvent {
        id: 56,
        name: "ThreadPoolWorkerThreadAdjustmentStats",
        versions: &[(0, THREAD_ADJUSTMENT_STATS)],
    },
    RuntimeEvent { id: 80, name: "ExceptionThrown", versions: &[(1, EXCEPTION_THROWN_V1)] },
];
