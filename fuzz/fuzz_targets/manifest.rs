//! The manifest reader and writer (`kcore::manifest`): arbitrary text, and
//! manifests with arbitrary names, paths and argument bytes. Never panics;
//! whatever parses renders and parses back to itself; whatever renders
//! parses back to itself (`parse(render(m)) == m`).

#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use kcore::manifest::Manifest;
use libfuzzer_sys::fuzz_target;

#[derive(Debug)]
enum Input {
    Text(Vec<u8>),
    Spec(Manifest),
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        Ok(if u.arbitrary()? {
            let mut text = b"perch-manifest 1\n".to_vec();
            if u.ratio(1, 8)? {
                text.clear();
            }
            text.extend_from_slice(u.arbitrary()?);
            Input::Text(text)
        } else {
            Input::Spec(perch_fuzz_input::newc::manifest(u)?)
        })
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Text(text) => {
            let Ok(m) = Manifest::parse(&text) else {
                return;
            };
            for p in &m.processes {
                p.check().expect("a parsed process passes the checks");
            }
            let again = m.render().expect("a parsed manifest renders");
            assert_eq!(Manifest::parse(again.as_bytes()), Ok(m));
        }
        Input::Spec(m) => {
            let Ok(text) = m.render() else {
                return;
            };
            assert_eq!(Manifest::parse(text.as_bytes()), Ok(m));
        }
    }
});
