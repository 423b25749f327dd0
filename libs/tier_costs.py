"""What moving adapter bytes between the storage tiers costs, in the reference deployment (BRIEF.md
section 2). The capacity planner (libs/planner), the fleet simulator (libs/simulator) and the
simulated engine (libs/engine/sim_engine.py) all start from these figures; this module imports
nothing, so the engine does not sit above the planner to read them."""

GB = 1e9  # decimal gigabytes throughout: bandwidths are quoted in GB/s

HOST_TO_GPU_GB_S = 25.0  # host RAM -> GPU copy, PCIe Gen5, effective
NVME_GB_S = 7.0  # local NVMe read, PCIe Gen4 x4
OBJECT_STORE_FETCH_S_MIN = 0.5  # one adapter from the object store, seconds
OBJECT_STORE_FETCH_S_MAX = 1.5
