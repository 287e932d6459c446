//! Decoded record sequences written as perf.data the way `perch record`
//! writes them (the stream adapter, the converter, the perf.data writer),
//! for the `perf_data` fuzz target and the `perf script` regression test
//! over its saved corpus.

use std::io::Cursor;

use arbitrary::{Result, Unstructured};
use host_tool::convert::{ConvertError, ConvertOptions, ConvertSummary, Converter};
use host_tool::image::Image;
use host_tool::wire::Adapter;
use sampler::event::sample_type as st;
use sampler::regs::{Abi, VALID_MASK_WITH_XMM};
use sampler::wire::Record;

/// The host tool's test appliance (a runtime ELF with task text), the
/// image some conversions are given.
pub const APPLIANCE_ELF: &[u8] = include_bytes!("../../../host-tool/tests/fixtures/appliance.elf");

/// What one fuzz input becomes.
#[derive(Clone, Debug)]
pub struct Case {
    /// The decoded records, in stream order.
    pub records: Vec<Record>,
    /// Convert with the test appliance as the image.
    pub with_image: bool,
}

/// The sample_type bits the writer lays out.
pub const WRITTEN_SAMPLE_TYPE: u64 = st::IDENTIFIER
    | st::IP
    | st::TID
    | st::TIME
    | st::ADDR
    | st::ID
    | st::STREAM_ID
    | st::CPU
    | st::PERIOD
    | st::CALLCHAIN
    | st::BRANCH_STACK
    | st::REGS_USER
    | st::WEIGHT
    | st::DATA_SRC
    | st::REGS_INTR
    | st::WEIGHT_STRUCT;

/// Makes most samples fit the event the Hello declares for them (register
/// counts matching the masks), so conversions get past the writer's checks
/// and into its layout; the input decides how much is left as it was.
fn conform(u: &mut Unstructured<'_>, records: &mut [Record]) -> Result<()> {
    let mut events = Vec::new();
    for r in records.iter_mut() {
        match r {
            Record::Hello(h) => {
                for e in h.events.iter_mut() {
                    if u.ratio(7, 8)? {
                        e.regs_user &= VALID_MASK_WITH_XMM;
                        e.regs_intr &= VALID_MASK_WITH_XMM;
                    }
                    if u.ratio(3, 4)? {
                        e.sample_type &= WRITTEN_SAMPLE_TYPE;
                    }
                }
                events = h.events.to_vec();
            }
            Record::Sample(s) => {
                let Some(e) = events.iter().find(|e| e.id == s.event) else {
                    continue;
                };
                if u.ratio(1, 8)? {
                    continue;
                }
                for (regs, mask) in [
                    (&mut s.regs_user, e.regs_user),
                    (&mut s.regs_intr, e.regs_intr),
                ] {
                    if let Some(r) = regs
                        && r.abi != Abi::None
                    {
                        r.mask = mask & VALID_MASK_WITH_XMM;
                        let n = r.mask.count_ones() as usize;
                        r.values.truncate(n);
                        while r.values.len() < n {
                            // Cannot fail: at most 56 mask bits are valid.
                            let _ = r.values.push(u.arbitrary()?);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

impl Case {
    /// The case an input describes.
    pub fn from_input(u: &mut Unstructured<'_>) -> Result<Case> {
        let mut records = crate::wire::records(u)?;
        let with_image = u.arbitrary()?;
        conform(u, &mut records)?;
        Ok(Case {
            records,
            with_image,
        })
    }

    /// The case the bytes of a saved input describe.
    pub fn from_bytes(data: &[u8]) -> Result<Case> {
        Case::from_input(&mut Unstructured::new(data))
    }

    /// Converts the records as `perch record` does and returns the
    /// perf.data bytes.
    pub fn convert(&self) -> std::result::Result<(Vec<u8>, ConvertSummary), ConvertError> {
        let image = self.with_image.then(|| {
            Image::parse(APPLIANCE_ELF, "/fuzz/appliance.elf".into())
                .expect("the test appliance parses")
        });
        let options = ConvertOptions {
            image,
            cmdline: vec!["perch".into(), "record".into()],
            programs: Default::default(),
            kernel_file: None,
        };
        let mut conv = Converter::new(Cursor::new(Vec::new()), options);
        let mut adapter = Adapter::new();
        for r in &self.records {
            adapter.with_item(r, |item| conv.push(item))?;
        }
        let (out, summary) = conv.finish()?;
        Ok((out.into_inner(), summary))
    }
}
