//! The message writer behind every request encoder.
use super::*;

/// Builds one message in memory; the size field is patched in [`MessageWriter::finish`].
pub(super) struct MessageWriter {
    code: CommandCode,
    buf: Vec<u8>,
}

impl MessageWriter {
    pub(super) fn new(code: CommandCode) -> MessageWriter {
        let (set, id) = code.set_and_id();
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&[0, 0, set, id, 0, 0]);
        MessageWriter { code, buf }
    }

    pub(super) fn finish(mut self) -> Result<Vec<u8>, EncodeError> {
        let size = u16::try_from(self.buf.len())
            .map_err(|_| EncodeError::TooLarge { command: self.code, size: self.buf.len() })?;
        self.buf[14..16].copy_from_slice(&size.to_le_bytes());
        Ok(self.buf)
    }

    pub(super) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub(super) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub(super) fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    pub(super) fn u32_array(&mut self, values: &[u32]) {
        self.array_len(values.len());
        for v in values {
            self.u32(*v);
        }
    }

    pub(super) fn array_len(&mut self, len: usize) {
        // Lengths above u32 cannot occur: the message is capped at 65535 bytes in finish().
        self.u32(u32::try_from(len).unwrap_or(u32::MAX));
    }

    /// `None` → count 0; `Some(s)` → count = UTF-16 units + 1, the units, then NUL.
    pub(super) fn string(&mut self, s: Option<&str>) -> Result<(), EncodeError> {
        let Some(s) = s else {
            self.u32(0);
            return Ok(());
        };
        if s.contains('\0') {
            return Err(EncodeError::NulInString { value: s.to_owned() });
        }
        let units: Vec<u16> = s.encode_utf16().collect();
        self.array_len(units.len() + 1);
        for unit in units.into_iter().chain([0]) {
            self.buf.extend_from_slice(&unit.to_le_bytes());
        }
        Ok(())
    }

    pub(super) fn streaming_prefix(
        &mut self,
        buffer_mb: u32,
        format: TraceFormat,
    ) -> Result<(), EncodeError> {
        if buffer_mb == 0 {
            return Err(EncodeError::ZeroBuffer);
        }
        self.u32(buffer_mb);
        self.u32(format as u32);
        Ok(())
    }

    pub(super) fn providers<T>(
        &mut self,
        providers: &[T],
        mut each: impl FnMut(&mut Self, &T) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        match providers.len() {
            0 => return Err(EncodeError::NoProviders),
            count if count > MAX_PROVIDERS => return Err(EncodeError::TooManyProviders { count }),
            count => self.array_len(count),
        }
        for (index, provider) in providers.iter().enumerate() {
            // provider() cannot know its position in the list: fill it in here.
            each(self, provider).map_err(|e| match e {
                EncodeError::EmptyProviderName { .. } => EncodeError::EmptyProviderName { index },
                other => other,
            })?;
        }
        Ok(())
    }

    pub(super) fn provider(&mut self, p: &ProviderConfig) -> Result<(), EncodeError> {
        if p.name.is_empty() {
            return Err(EncodeError::EmptyProviderName { index: 0 });
        }
        self.u64(p.keywords);
        self.u32(p.level as u32);
        self.string(Some(&p.name))?;
        self.string(p.arguments.as_deref())
    }

    pub(super) fn event_filter(&mut self, filter: Option<&EventFilter>) {
        let (enable, ids) = EventFilter::wire(filter);
        self.bool(enable);
        self.u32_array(ids);
    }

    pub(super) fn tracepoint_config(
        &mut self,
        provider: &str,
        config: &TracepointConfig,
    ) -> Result<(), EncodeError> {
        if config.default_name.is_none() && config.sets.is_empty() {
            return Err(EncodeError::NoTracepoint { provider: provider.to_owned() });
        }
        let mut seen = std::collections::HashSet::new();
        for set in &config.sets {
            if set.name.is_empty() {
                return Err(EncodeError::EmptyTracepointName { provider: provider.to_owned() });
            }
            if set.event_ids.is_empty() {
                return Err(EncodeError::EmptyTracepointSet {
                    provider: provider.to_owned(),
                    tracepoint: set.name.clone(),
                });
            }
            if let Some(&event_id) = set.event_ids.iter().find(|id| !seen.insert(**id)) {
                return Err(EncodeError::DuplicateTracepointEvent {
                    provider: provider.to_owned(),
                    event_id,
                });
            }
        }
        self.string(config.default_name.as_deref())?;
        self.array_len(config.sets.len());
        for set in &config.sets {
            self.string(Some(&set.name))?;
            self.u32_array(&set.event_ids);
        }
        Ok(())
    }
}
