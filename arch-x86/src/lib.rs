//! Everything that touches the x86-64 CPU. The hardware `unsafe` lives here.
#![cfg_attr(not(test), no_std)]
