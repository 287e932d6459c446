//! Boot archives (cpio newc) built from fuzz input: members whose paths are
//! made of a few components (so that duplicates, `.`/`..` components,
//! leading `/` and `./` and the manifest's path all occur), any file type,
//! a manifest rendered from an arbitrary one, the trailer or not, then
//! arbitrary overwrites of header bytes.

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::elf::Edit;

/// Path components members are named with.
const COMPONENTS: [&str; 9] = ["bin", "a", "p", ".perch", "manifest", ".", "..", "", "etc"];

/// One archive member.
#[derive(Clone, Debug)]
pub struct Member {
    /// The name as written (no NUL).
    pub name: Vec<u8>,
    /// `c_mode`.
    pub mode: u32,
    /// `c_mtime`.
    pub mtime: u32,
    /// The data.
    pub data: Vec<u8>,
}

impl<'a> Arbitrary<'a> for Member {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let name = if u.ratio(1, 8)? {
            u.arbitrary::<Vec<u8>>()?
        } else {
            let mut s = String::new();
            match u.int_in_range(0..=5)? {
                0 => s.push('/'),
                1 => s.push_str("./"),
                _ => {}
            }
            let n = u.int_in_range(1..=3)?;
            for i in 0..n {
                if i > 0 {
                    s.push('/');
                }
                s.push_str(u.choose(&COMPONENTS)?);
            }
            if u.ratio(1, 8)? {
                s.push('/');
            }
            s.into_bytes()
        };
        let kind: u32 = *u.choose(&[0o100000, 0o100000, 0o040000, 0o120000, 0o020000, 0])?;
        let mode = if u.ratio(1, 16)? {
            u.arbitrary()?
        } else {
            kind | (u.arbitrary::<u32>()? & 0o7777)
        };
        Ok(Member {
            name,
            mode,
            mtime: u.arbitrary()?,
            data: u.arbitrary()?,
        })
    }
}

/// An archive.
#[derive(Clone, Debug, Arbitrary)]
pub struct ArchiveSpec {
    /// The members, in order.
    pub members: Vec<Member>,
    /// A `.perch/manifest` member with this text, inserted at this index.
    pub manifest: Option<(u8, Vec<u8>)>,
    /// The trailer is written.
    pub trailer: bool,
    /// Bytes after the trailer (zeros are allowed, anything else is not).
    pub after: Vec<u8>,
    /// Overwrites applied last.
    pub edits: Vec<Edit>,
}

fn header(out: &mut Vec<u8>, ino: u32, m: &Member) {
    out.extend_from_slice(b"070701");
    let fields = [
        ino,
        m.mode,
        0,
        0,
        1,
        m.mtime,
        m.data.len() as u32,
        0,
        0,
        0,
        0,
        m.name.len() as u32 + 1,
        0,
    ];
    for f in fields {
        out.extend_from_slice(format!("{f:08X}").as_bytes());
    }
    out.extend_from_slice(&m.name);
    out.push(0);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(&m.data);
    out.resize(out.len().next_multiple_of(4), 0);
}

impl ArchiveSpec {
    /// The archive's bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut members: Vec<Member> = self.members.iter().take(16).cloned().collect();
        if let Some((at, text)) = &self.manifest {
            let at = usize::from(*at) % (members.len() + 1);
            members.insert(
                at,
                Member {
                    name: b".perch/manifest".to_vec(),
                    mode: 0o100644,
                    mtime: 0,
                    data: text.clone(),
                },
            );
        }
        let mut out = Vec::new();
        for (i, m) in members.iter().enumerate() {
            header(&mut out, i as u32 + 1, m);
        }
        if self.trailer {
            let t = Member {
                name: b"TRAILER!!!".to_vec(),
                mode: 0,
                mtime: 0,
                data: Vec::new(),
            };
            header(&mut out, 0, &t);
        }
        out.extend_from_slice(&self.after[..self.after.len().min(64)]);
        for e in self.edits.iter().take(8) {
            e.apply(&mut out);
        }
        out
    }
}

/// A manifest from the input: names, paths and argument bytes drawn
/// freely, so both valid and refused ones occur.
pub fn manifest(u: &mut Unstructured<'_>) -> Result<kcore::manifest::Manifest> {
    use kcore::manifest::{Manifest, ProcessSpec};
    let n = u.int_in_range(0..=kcore::manifest::MAX_PROCESSES + 1)?;
    let mut processes = Vec::new();
    for _ in 0..n {
        let short = |u: &mut Unstructured<'_>| -> Result<String> {
            let s: String = u.arbitrary()?;
            Ok(s.chars().take(20).collect())
        };
        let name = if u.ratio(3, 4)? {
            let len = u.int_in_range(1..=15)?;
            (0..len)
                .map(|_| Ok(char::from(u.int_in_range(0x21u8..=0x7e)?)))
                .collect::<Result<String>>()?
        } else {
            short(u)?
        };
        let mut p = ProcessSpec::new(&name, &short(u)?);
        if u.arbitrary()? {
            p.argv = u.arbitrary()?;
        }
        p.envp = u.arbitrary()?;
        if u.arbitrary()? {
            p.cwd = short(u)?;
        }
        processes.push(p);
    }
    Ok(Manifest { processes })
}
