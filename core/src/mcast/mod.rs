//! Market-data path protocol logic (in progress).
