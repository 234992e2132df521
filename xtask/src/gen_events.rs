//! `cargo xtask gen-runtime-events MANIFEST...`: turns the runtime's event manifests
//! (`ClrEtwAll.man` and overlays in the same schema) into the payload-layout table
//! `tracer-decode/src/nettrace/runtime_events/generated.rs`. The table is data: names, versions,
//! field types, counts and value maps of every event of the runtime's native providers
//! (docs/protocol/runtime-events.md says where the manifests come from and how to regenerate).
//!
//! Later manifests win for the same (provider, event id, version): an overlay adds the events
//! and versions a base manifest lacks. A template or map an overlay names but does not define
//! is looked up in the earlier manifests of the same provider, and a map an overlay redefines
//! (new values) replaces the earlier one in every event of that provider.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail, ensure};
use sha2::{Digest as _, Sha256};

/// The providers whose events carry no field metadata on the wire.
pub const PROVIDERS: [&str; 4] = [
    "Microsoft-Windows-DotNETRuntime",
    "Microsoft-Windows-DotNETRuntimeRundown",
    "Microsoft-Windows-DotNETRuntimePrivate",
    "Microsoft-DotNETRuntimeMonoProfiler",
];

const NS: &str = "http://schemas.microsoft.com/win/2004/08/events";

pub fn output_path() -> PathBuf {
    crate::util::workspace_root().join("tracer-decode/src/nettrace/runtime_events/generated.rs")
}

pub fn run(manifests: &[PathBuf]) -> anyhow::Result<()> {
    ensure!(!manifests.is_empty(), "name at least one manifest (ClrEtwAll.man)");
    let mut sources = Vec::new();
    let mut table = Table::default();
    for path in manifests {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the manifest {}", path.display()))?;
        let digest = Sha256::digest(text.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        sources.push(format!("{} (sha256 {hex})", file_name(path)));
        table.add(&text).with_context(|| format!("in {}", path.display()))?;
    }
    let rust = table.render(&sources)?;
    let out = output_path();
    std::fs::write(&out, rust).with_context(|| format!("writing {}", out.display()))?;
    let events: usize = table.providers.values().map(BTreeMap::len).sum();
    println!("gen-runtime-events: {events} event versions written to {}", out.display());
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into())
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Scalar(&'static str),
    Struct(Vec<Field>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Count {
    One,
    Fixed(u16),
    /// Index of an earlier field of the same level.
    Field(usize),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ValueMap {
    bitmap: bool,
    entries: Vec<(u64, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Field {
    name: String,
    kind: Kind,
    count: Count,
    /// The map's name (what a later manifest redefines) and its entries.
    map: Option<(String, ValueMap)>,
}

#[derive(Clone, Debug)]
struct Event {
    name: String,
    fields: Vec<Field>,
}

/// Templates and maps of one provider in one manifest, kept for the overlays after it.
#[derive(Default)]
struct Definitions {
    templates: HashMap<String, Vec<Field>>,
    maps: HashMap<String, ValueMap>,
}

#[derive(Default)]
struct Table {
    /// provider → (event id, version) → event.
    providers: BTreeMap<&'static str, BTreeMap<(u32, u32), Event>>,
    earlier: HashMap<&'static str, Vec<Definitions>>,
    /// The string tables of every manifest so far (map labels).
    strings: HashMap<String, String>,
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|c| c.has_tag_name((NS, name)))
}

fn children<'a, 'i>(
    node: roxmltree::Node<'a, 'i>,
    name: &'static str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    node.children().filter(move |c| c.has_tag_name((NS, name)))
}

fn attr<'a>(node: roxmltree::Node<'a, '_>, name: &str) -> anyhow::Result<&'a str> {
    node.attribute(name).ok_or_else(|| {
        anyhow!("<{}> at byte {} has no {name}", node.tag_name().name(), node.range().start)
    })
}

fn number(text: &str) -> anyhow::Result<u64> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.with_context(|| format!("{text:?} is not a number"))
}

/// The event's name without its `_V<n>` version suffix (`GCStart_V2` → `GCStart`).
fn base_name(symbol: &str) -> &str {
    match symbol.rsplit_once("_V") {
        Some((base, v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => symbol,
    }
}

impl Table {
    fn add(&mut self, text: &str) -> anyhow::Result<()> {
        let doc = roxmltree::Document::parse(text).context("parsing the manifest XML")?;
        // Strings come first: an overlay's maps may use the labels of the manifests before it.
        let strings =
            doc.descendants().filter(|n| n.has_tag_name((NS, "string"))).filter_map(|n| {
                Some((n.attribute("id")?.to_owned(), n.attribute("value")?.to_owned()))
            });
        self.strings.extend(strings);
        for provider in doc.descendants().filter(|n| n.has_tag_name((NS, "provider"))) {
            let name = attr(provider, "name")?;
            let Some(&known) = PROVIDERS.iter().find(|p| **p == name) else { continue };
            self.add_provider(known, provider).with_context(|| format!("provider {name}"))?;
        }
        Ok(())
    }

    fn add_provider(
        &mut self,
        provider: &'static str,
        node: roxmltree::Node<'_, '_>,
    ) -> anyhow::Result<()> {
        let mut defs = Definitions::default();
        if let Some(maps) = child(node, "maps") {
            for map in maps.children().filter(roxmltree::Node::is_element) {
                let bitmap = match map.tag_name() {
                    n if n == (NS, "valueMap").into() => false,
                    n if n == (NS, "bitMap").into() => true,
                    _ => continue, // the runtime's own extensions (other namespaces)
                };
                let mut entries = Vec::new();
                for entry in children(map, "map") {
                    let message = attr(entry, "message")?;
                    let id = message.strip_prefix("$(string.").and_then(|m| m.strip_suffix(')'));
                    let label =
                        match id {
                            Some(id) => self.strings.get(id).cloned().ok_or_else(|| {
                                anyhow!("map label {id} is not in a string table")
                            })?,
                            None => message.to_owned(),
                        };
                    entries.push((number(attr(entry, "value")?)?, label.trim().to_owned()));
                }
                entries.sort();
                defs.maps.insert(attr(map, "name")?.to_owned(), ValueMap { bitmap, entries });
            }
        }
        // Events of earlier manifests take the maps this one redefines.
        for event in self.providers.entry(provider).or_default().values_mut() {
            remap(&mut event.fields, &defs.maps);
        }
        if let Some(templates) = child(node, "templates") {
            for template in children(templates, "template") {
                let tid = attr(template, "tid")?;
                let fields = self
                    .fields(provider, template, &defs)
                    .with_context(|| format!("template {tid}"))?;
                defs.templates.insert(tid.to_owned(), fields);
            }
        }
        let events = child(node, "events").context("no <events>")?;
        for event in children(events, "event") {
            let id = u32::try_from(number(attr(event, "value")?)?)?;
            let version = u32::try_from(number(event.attribute("version").unwrap_or("0"))?)?;
            let symbol = attr(event, "symbol")?;
            let mut fields = match event.attribute("template") {
                None => Vec::new(),
                Some(tid) => self
                    .template(provider, tid, &defs)
                    .with_context(|| format!("event {symbol}"))?
                    .clone(),
            };
            // A template of an earlier manifest takes the maps this one redefines.
            remap(&mut fields, &defs.maps);
            let entry = Event { name: base_name(symbol).to_owned(), fields };
            self.providers.entry(provider).or_default().insert((id, version), entry);
        }
        self.earlier.entry(provider).or_default().push(defs);
        Ok(())
    }

    fn template<'s>(
        &'s self,
        provider: &str,
        tid: &str,
        defs: &'s Definitions,
    ) -> anyhow::Result<&'s Vec<Field>> {
        let earlier = self.earlier.get(provider).into_iter().flatten().rev();
        std::iter::once(defs)
            .chain(earlier)
            .find_map(|d| d.templates.get(tid))
            .ok_or_else(|| anyhow!("template {tid} is not defined"))
    }

    fn map(&self, provider: &str, name: &str, defs: &Definitions) -> anyhow::Result<ValueMap> {
        let earlier = self.earlier.get(provider).into_iter().flatten().rev();
        std::iter::once(defs)
            .chain(earlier)
            .find_map(|d| d.maps.get(name))
            .cloned()
            .ok_or_else(|| anyhow!("map {name} is not defined"))
    }

    /// The `<data>` and `<struct>` children of a template or struct, in payload order.
    fn fields(
        &self,
        provider: &str,
        parent: roxmltree::Node<'_, '_>,
        defs: &Definitions,
    ) -> anyhow::Result<Vec<Field>> {
        let mut fields: Vec<Field> = Vec::new();
        for node in parent.children().filter(roxmltree::Node::is_element) {
            let tag = node.tag_name().name();
            let name = match tag {
                "data" | "struct" => attr(node, "name")?.to_owned(),
                _ => continue, // <UserData>: rendering hints for Windows tools
            };
            let kind = if tag == "struct" {
                Kind::Struct(self.fields(provider, node, defs)?)
            } else {
                Kind::Scalar(scalar_kind(attr(node, "inType")?)?)
            };
            let count_attr = node.attribute("count").or_else(|| node.attribute("length"));
            let count = match count_attr {
                None => Count::One,
                Some(n) if n.bytes().all(|b| b.is_ascii_digit()) => Count::Fixed(n.parse()?),
                Some(n) => Count::Field(
                    fields
                        .iter()
                        .position(|f| f.name == n)
                        .ok_or_else(|| anyhow!("{name}: count field {n} is not before it"))?,
                ),
            };
            if kind == Kind::Scalar("Binary") && count == Count::One {
                bail!("{name}: binary data without a length");
            }
            let map = match node.attribute("map") {
                Some(m) => Some((m.to_owned(), self.map(provider, m, defs)?)),
                None => None,
            };
            fields.push(Field { name, kind, count, map });
        }
        Ok(fields)
    }

    fn render(&self, sources: &[String]) -> anyhow::Result<String> {
        let mut out = String::new();
        writeln!(out, "//! @generated by `cargo xtask gen-runtime-events` from:")?;
        for s in sources {
            writeln!(out, "//! - {s}")?;
        }
        writeln!(out, "//!")?;
        writeln!(out, "//! Do not edit: see docs/protocol/runtime-events.md.")?;
        writeln!(out, "#![cfg_attr(rustfmt, rustfmt_skip)]")?;
        writeln!(out, "use super::Count::*;")?;
        writeln!(out, "use super::Kind::*;")?;
        writeln!(out, "use super::{{RuntimeEvent, RuntimeField, RuntimeProvider, ValueMap}};")?;
        let mut consts = Consts::default();
        let mut providers = String::new();
        for (provider, events) in &self.providers {
            let mut by_id: BTreeMap<u32, Vec<(u32, &Event)>> = BTreeMap::new();
            for (&(id, version), event) in events {
                by_id.entry(id).or_default().push((version, event));
            }
            writeln!(providers, "    RuntimeProvider {{ name: {provider:?}, events: &[")?;
            for (id, versions) in by_id {
                // The newest version names the event.
                let name = &versions.last().expect("at least one version").1.name;
                let list: Vec<String> = versions
                    .iter()
                    .map(|(v, e)| Ok(format!("({v}, {})", consts.fields(&e.fields)?)))
                    .collect::<anyhow::Result<_>>()?;
                writeln!(
                    providers,
                    "        RuntimeEvent {{ id: {id}, name: {name:?}, versions: &[{}] }},",
                    list.join(", ")
                )?;
            }
            writeln!(providers, "    ] }},")?;
        }
        out.push_str(&consts.text);
        writeln!(out, "pub(super) static PROVIDERS: &[RuntimeProvider] = &[")?;
        out.push_str(&providers);
        writeln!(out, "];")?;
        Ok(out)
    }
}

/// Replaces every map of `fields` (structs included) that `maps` redefines.
fn remap(fields: &mut [Field], maps: &HashMap<String, ValueMap>) {
    for f in fields {
        if let Some((name, map)) = &mut f.map
            && let Some(newer) = maps.get(name.as_str())
        {
            *map = newer.clone();
        }
        if let Kind::Struct(members) = &mut f.kind {
            remap(members, maps);
        }
    }
}

fn scalar_kind(in_type: &str) -> anyhow::Result<&'static str> {
    Ok(match in_type {
        "win:UInt8" => "U8",
        "win:UInt16" => "U16",
        "win:UInt32" => "U32",
        "win:UInt64" => "U64",
        "win:Int8" => "I8",
        "win:Int16" => "I16",
        "win:Int32" => "I32",
        "win:Int64" => "I64",
        "win:Float" => "F32",
        "win:Double" => "F64",
        "win:Boolean" => "Bool32",
        "win:Pointer" => "Pointer",
        "win:GUID" => "Guid",
        "win:UnicodeString" => "Utf16Z",
        "win:AnsiString" => "AnsiZ",
        "win:Binary" => "Binary",
        other => bail!("input type {other} is not known to the decoder"),
    })
}

/// Field lists and maps as named constants, each distinct one once.
#[derive(Default)]
struct Consts {
    text: String,
    fields: HashMap<Vec<Field>, String>,
    maps: HashMap<ValueMap, String>,
}

impl Consts {
    fn fields(&mut self, fields: &[Field]) -> anyhow::Result<String> {
        if fields.is_empty() {
            return Ok("&[]".into());
        }
        if let Some(name) = self.fields.get(fields) {
            return Ok(name.clone());
        }
        let mut items = Vec::new();
        for f in fields {
            let kind = match &f.kind {
                Kind::Scalar(k) => (*k).to_owned(),
                Kind::Struct(members) => format!("Struct({})", self.fields(members)?),
            };
            let count = match f.count {
                Count::One => "One".to_owned(),
                Count::Fixed(n) => format!("Fixed({n})"),
                Count::Field(i) => format!("Field({i})"),
            };
            let map = match &f.map {
                None => "None".to_owned(),
                Some((_, m)) => format!("Some(&{})", self.map(m)?),
            };
            items.push(format!(
                "    RuntimeField {{ name: {:?}, kind: {kind}, count: {count}, map: {map} }},\n",
                f.name
            ));
        }
        let name = format!("T{}", self.fields.len());
        writeln!(self.text, "const {name}: &[RuntimeField] = &[\n{}];", items.concat())?;
        self.fields.insert(fields.to_vec(), name.clone());
        Ok(name)
    }

    fn map(&mut self, map: &ValueMap) -> anyhow::Result<String> {
        if let Some(name) = self.maps.get(map) {
            return Ok(name.clone());
        }
        let name = format!("M{}", self.maps.len());
        let entries: Vec<String> =
            map.entries.iter().map(|(v, label)| format!("({v:#x}, {label:?})")).collect();
        writeln!(
            self.text,
            "static {name}: ValueMap = ValueMap {{ bitmap: {}, entries: &[{}] }};",
            map.bitmap,
            entries.join(", ")
        )?;
        self.maps.insert(map.clone(), name.clone());
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"<instrumentationManifest xmlns="http://schemas.microsoft.com/win/2004/08/events">
<instrumentation><events>
<provider name="Microsoft-Windows-DotNETRuntime" guid="{x}" symbol="R">
  <events>
    <event value="1" version="0" symbol="GCStart" template="GCStart"/>
    <event value="1" version="1" symbol="GCStart_V1" template="GCStart_V1"/>
    <event value="7" symbol="GCRestartEEBegin"/>
  </events>
  <templates>
    <template tid="GCStart"><data name="Count" inType="win:UInt32"/></template>
    <template tid="GCStart_V1">
      <data name="Count" inType="win:UInt32"/>
      <data name="Reason" inType="win:UInt32" map="GCReasonMap"/>
      <data name="Size" inType="win:UInt32"/>
      <data name="Data" inType="win:Binary" length="Size"/>
      <struct name="Values" count="Count"><data name="V" inType="win:UInt64"/></struct>
      <UserData><x/></UserData>
    </template>
  </templates>
  <maps><valueMap name="GCReasonMap">
    <map value="0x1" message="$(string.R.Induced)"/><map value="0" message="$(string.R.Small)"/>
  </valueMap></maps>
</provider>
<provider name="Other" guid="{y}" symbol="O"><events/></provider>
</events></instrumentation>
<localization><resources culture="en-US"><stringTable>
  <string id="R.Induced" value="Induced"/><string id="R.Small" value="AllocSmall"/>
</stringTable></resources></localization>
</instrumentationManifest>"#;

    #[test]
    fn templates_counts_and_maps_become_constants() {
        let mut table = Table::default();
        table.add(MANIFEST).unwrap();
        let rust = table.render(&["m.man".into()]).unwrap();
        assert!(rust.contains("static M0: ValueMap = ValueMap { bitmap: false, entries: &[(0x0, \"AllocSmall\"), (0x1, \"Induced\")] };"), "{rust}");
        assert!(
            rust.contains(
                "RuntimeField { name: \"Data\", kind: Binary, count: Field(2), map: None }"
            ),
            "{rust}"
        );
        assert!(rust.contains("kind: Struct(T"), "{rust}");
        assert!(
            rust.contains(
                "RuntimeEvent { id: 1, name: \"GCStart\", versions: &[(0, T0), (1, T2)] }"
            ),
            "{rust}"
        );
        assert!(
            rust.contains(
                "RuntimeEvent { id: 7, name: \"GCRestartEEBegin\", versions: &[(0, &[])] }"
            ),
            "{rust}"
        );
        assert!(!rust.contains("Other"), "{rust}");
    }

    #[test]
    fn an_overlay_adds_versions_and_uses_earlier_templates() {
        let overlay = MANIFEST
            .replace(
                r#"<event value="7" symbol="GCRestartEEBegin"/>"#,
                r#"<event value="1" version="2" symbol="GCStart_V2" template="GCStart"/>"#,
            )
            .replace(
                r#"<template tid="GCStart"><data name="Count" inType="win:UInt32"/></template>"#,
                "",
            );
        let mut table = Table::default();
        table.add(MANIFEST).unwrap();
        table.add(&overlay).unwrap();
        let versions: Vec<u32> =
            table.providers["Microsoft-Windows-DotNETRuntime"].keys().map(|k| k.1).collect();
        assert_eq!(versions, [0, 1, 2, 0]);
    }

    #[test]
    fn a_map_an_overlay_redefines_reaches_the_earlier_events() {
        let overlay = MANIFEST
            .replace(r#"<map value="0x1" message="$(string.R.Induced)"/>"#, r#"<map value="0x1" message="$(string.R.Induced)"/><map value="0x2" message="$(string.R.Low)"/>"#)
            .replace(r#"<string id="R.Small" value="AllocSmall"/>"#, r#"<string id="R.Small" value="AllocSmall"/><string id="R.Low" value="LowMemory"/>"#)
            .replace(r#"<event value="7" symbol="GCRestartEEBegin"/>"#, "")
            .replace(r#"<event value="1" version="0" symbol="GCStart" template="GCStart"/>"#, "")
            .replace(r#"<event value="1" version="1" symbol="GCStart_V1" template="GCStart_V1"/>"#, "");
        let mut table = Table::default();
        table.add(MANIFEST).unwrap();
        table.add(&overlay).unwrap();
        let rust = table.render(&[]).unwrap();
        assert!(rust.contains(r#"(0x2, "LowMemory")"#), "{rust}");
        assert!(!rust.contains(r#"entries: &[(0x0, "AllocSmall"), (0x1, "Induced")] }"#), "{rust}");
    }

    #[test]
    fn a_count_naming_a_later_field_is_an_error() {
        let bad = MANIFEST.replace(r#"length="Size""#, r#"length="Later""#);
        let err = Table::default().add(&bad).unwrap_err();
        assert!(format!("{err:#}").contains("Data: count field Later is not before it"), "{err:#}");
    }

    #[test]
    fn version_suffixes_are_not_part_of_names() {
        assert_eq!(base_name("GCStart_V2"), "GCStart");
        assert_eq!(base_name("GCStart"), "GCStart");
        assert_eq!(base_name("Method_Verbose"), "Method_Verbose");
    }
}
