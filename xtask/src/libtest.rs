//! The closing line a libtest binary prints (`test result: ok. 4 passed; 0 failed; 0 ignored;
//! 0 measured; 0 filtered out; finished in 0.51s`): the counts of a `vm_*` binary and of
//! `cargo test --doc` come from it, not from an exit status alone.
use std::ops::AddAssign;

const PREFIX: &str = "test result: ";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TestResult {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    pub measured: u64,
    pub filtered_out: u64,
}

impl TestResult {
    /// The counts of the result line in `line` (it may follow output that lacked a newline);
    /// `None` when there is none or it lacks one of the five counts.
    pub fn parse(line: &str) -> Option<TestResult> {
        let at = line.find(PREFIX)?;
        // `ok. ` or `FAILED. `, then `N word; ...`.
        let (_, counts) = line[at + PREFIX.len()..].split_once(". ")?;
        let count = |word: &str| {
            counts.split("; ").find_map(|part| part.strip_suffix(word)?.trim().parse().ok())
        };
        Some(TestResult {
            passed: count(" passed")?,
            failed: count(" failed")?,
            ignored: count(" ignored")?,
            measured: count(" measured")?,
            filtered_out: count(" filtered out")?,
        })
    }

    /// Every result line in `output`, added up (`cargo test --doc` prints one per crate).
    pub fn sum(output: &[String]) -> Option<TestResult> {
        output.iter().filter_map(|line| TestResult::parse(line)).reduce(|mut sum, r| {
            sum += r;
            sum
        })
    }
}

impl AddAssign for TestResult {
    fn add_assign(&mut self, r: TestResult) {
        self.passed += r.passed;
        self.failed += r.failed;
        self.ignored += r.ignored;
        self.measured += r.measured;
        self.filtered_out += r.filtered_out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passing_and_failing_result_lines() {
        assert_eq!(
            TestResult::parse(
                "test result: ok. 4 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; \
                 finished in 0.51s"
            ),
            Some(TestResult { passed: 4, failed: 0, ignored: 1, measured: 0, filtered_out: 2 })
        );
        assert_eq!(
            TestResult::parse(
                "garbage without newline test result: FAILED. 3 passed; 1 failed; 0 ignored; \
                 0 measured; 0 filtered out; finished in 12.00s"
            ),
            Some(TestResult { passed: 3, failed: 1, ..TestResult::default() })
        );
    }

    #[test]
    fn lines_without_all_counts_are_not_results() {
        assert_eq!(TestResult::parse("test result: ok"), None);
        assert_eq!(TestResult::parse("test result: ok. 4 passed; 0 failed"), None);
        assert_eq!(TestResult::parse("running 4 tests"), None);
    }

    #[test]
    fn doctest_results_of_several_crates_add_up() {
        let output = [
            "running 1 test".to_owned(),
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; \
             finished in 0.2s"
                .to_owned(),
            "test result: ok. 0 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; \
             finished in 0.0s"
                .to_owned(),
        ];
        assert_eq!(
            TestResult::sum(&output),
            Some(TestResult { passed: 1, ignored: 2, ..TestResult::default() })
        );
        assert_eq!(TestResult::sum(&output[..1]), None);
    }
}
