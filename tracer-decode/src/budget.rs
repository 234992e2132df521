//! Output bounded by input: what a peer sends pays for what tracer writes about it.
//!
//! Metadata is sent once and named by every event after it, so without a bound a few bytes per
//! event can render kilobytes (long provider, event and field names; escaped control
//! characters take 6 bytes each). An [`OutputBudget`] is earned by the bytes a peer sent and
//! spent by the bytes rendered for it:
//!
//! `output ≤ OUTPUT_BYTES_PER_INPUT_BYTE × input + OUTPUT_ALLOWANCE_BYTES`
//!
//! Real streams stay far below the rate (the captures in `tests/fixtures/nettrace` render
//! 3.6–9.2 output bytes per input byte, a generous envelope included). Decoding one payload is bounded
//! separately ([`crate::nettrace::payload::cost_budget`]), so no single event can render more
//! than O(payload + names) before the budget sees it.
//!
//! The named stacks of a session's lines (`stack`: the frames of a stack the stream defined
//! once, each named by a method event it sent once) are spent from a budget of their own, at
//! [`STACK_OUTPUT_BYTES_PER_INPUT_BYTE`]: a sample event takes about 10 bytes and names a stack
//! of tens of frames, so real sampled streams render 25 stack bytes per input byte for 10-frame
//! stacks and hundreds for an application's deep ones (docs/protocol/nettrace.md §4.6). Naming
//! a frame examines method-table entries, up to
//! [`crate::nettrace::methods::MAX_LOOKUP_CANDIDATES`]: each costs the budget a byte, so the
//! work of naming is bounded by input too. A stack is named only when the budget can pay for
//! the most it may cost ([`crate::nettrace::stacks::naming_cost_bound`]); a line whose stack it
//! cannot is written without it (counted), and the session goes on.

/// Output bytes one input byte pays for.
pub const OUTPUT_BYTES_PER_INPUT_BYTE: u64 = 64;
/// Output bytes allowed before any input (the first lines of a session).
pub const OUTPUT_ALLOWANCE_BYTES: u64 = 256 << 10;
/// Bytes of named stacks one input byte pays for (on top of the line's own budget).
pub const STACK_OUTPUT_BYTES_PER_INPUT_BYTE: u64 = 512;
/// Bytes of named stacks allowed before any input.
pub const STACK_OUTPUT_ALLOWANCE_BYTES: u64 = 1 << 20;

/// Spending `spend` bytes would take the output past the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "output budget exceeded: {output} + {spend} output bytes for {input} input bytes (limit \
     {per_input_byte} per input byte + {allowance})"
)]
pub struct BudgetExceeded {
    pub input: u64,
    pub output: u64,
    pub spend: u64,
    pub per_input_byte: u64,
    pub allowance: u64,
}

/// Output bytes earned by input bytes; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputBudget {
    per_input_byte: u64,
    allowance: u64,
    input: u64,
    output: u64,
}

impl Default for OutputBudget {
    fn default() -> Self {
        OutputBudget::new(OUTPUT_BYTES_PER_INPUT_BYTE, OUTPUT_ALLOWANCE_BYTES)
    }
}

impl OutputBudget {
    /// The budget of a session's named stacks ([`STACK_OUTPUT_BYTES_PER_INPUT_BYTE`]).
    pub fn for_stacks() -> Self {
        OutputBudget::new(STACK_OUTPUT_BYTES_PER_INPUT_BYTE, STACK_OUTPUT_ALLOWANCE_BYTES)
    }

    pub fn new(per_input_byte: u64, allowance: u64) -> Self {
        OutputBudget { per_input_byte, allowance, input: 0, output: 0 }
    }

    /// Credits `bytes` received from the peer.
    pub fn earn(&mut self, bytes: u64) {
        self.input = self.input.saturating_add(bytes);
    }

    /// The most output the input so far pays for.
    pub fn limit(&self) -> u64 {
        self.input.saturating_mul(self.per_input_byte).saturating_add(self.allowance)
    }

    /// What can still be spent.
    pub fn remaining(&self) -> u64 {
        self.limit().saturating_sub(self.output)
    }

    /// Spends `bytes` of output, or refuses (spending nothing) when that would pass the limit.
    pub fn spend(&mut self, bytes: u64) -> Result<(), BudgetExceeded> {
        match self.output.checked_add(bytes).filter(|&total| total <= self.limit()) {
            Some(total) => {
                self.output = total;
                Ok(())
            }
            None => Err(BudgetExceeded {
                input: self.input,
                output: self.output,
                spend: bytes,
                per_input_byte: self.per_input_byte,
                allowance: self.allowance,
            }),
        }
    }

    pub fn input(&self) -> u64 {
        self.input
    }

    pub fn output(&self) -> u64 {
        self.output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_bounded_by_input_and_a_refusal_spends_nothing() {
        let mut b = OutputBudget::new(4, 10);
        assert_eq!(b.limit(), 10);
        b.spend(10).unwrap();
        let refused =
            BudgetExceeded { input: 0, output: 10, spend: 1, per_input_byte: 4, allowance: 10 };
        assert_eq!(b.spend(1), Err(refused));
        b.earn(3);
        assert_eq!(b.limit(), 22);
        b.spend(12).unwrap();
        assert_eq!((b.input(), b.output()), (3, 22));
        assert!(b.spend(1).is_err());
        assert_eq!(b.output(), 22);
        b.earn(u64::MAX);
        assert_eq!(b.limit(), u64::MAX);
        assert!(b.spend(u64::MAX).is_err(), "no overflow");
    }
}
