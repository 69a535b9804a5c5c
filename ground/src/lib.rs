//! The embedded proving ground: doubles of the systems the product talks to, speaking their
//! real wire protocols on loopback, so the product code under test is the code that talks to
//! a real GitHub, a real cluster, a real chart repository.
//!
//! Each double is named as such: `ForgeDouble` stands in for GitHub (REST + git over real bare
//! repositories).

pub mod forge;
pub mod git;
pub mod kube;
