//! The embedded proving ground.
