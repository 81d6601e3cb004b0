//! vramlab-lerobot: native reader for LeRobot-format datasets (work in progress).
