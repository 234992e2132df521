//! The ftrace reader with sub-buffers larger than a page (`buffer_subbuf_size_kb`, Linux ≥ 6.8),
//! in the test kernel: the host's kernel may refuse to change the size (tests/ftrace.rs checks
//! that refusal).
use tests::ftrace::*;
use tracer::kernel::ftrace_reader::ReadMode;

#[test]
fn ftrace_pipeline_streams_json_lines_in_four_page_sub_buffers() {
    pipeline_streams_json_lines(Some(16));
}

#[tokio::test]
async fn large_subbuffers_are_drained_completely_mmap() {
    concurrent_writer_is_drained_completely(ReadMode::Mmap, "subbuf-mmap", Some(64)).await;
}

#[tokio::test]
async fn large_subbuffers_are_drained_completely_read() {
    concurrent_writer_is_drained_completely(ReadMode::Read, "subbuf-read", Some(64)).await;
}
