"""What each Xid means and what to do: NVIDIA's Xid catalog, each Xid's resolution bucket as published.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (https://docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html, the table behind https://docs.nvidia.com/Xid-Catalog.xlsx: code, mnemonic,
description, "Resolution Bucket (Immediate Action)", "Resolution Bucket (Investigatory Action)", trigger
conditions; "for Ampere and newer GPUs (including PCIe form-factor GPUs)"). The page carries no version or
date; the revision read here (stored copy, read 2026) lists Xids 1-172, its newest rows marked "CUDA 12.9;
GPU driver R575" (Xids 143, 160, 161). ``CATALOG`` copies its rows: every Xid it lists, "Unused" ones too.
Background: NVIDIA, "Xid Errors" (https://docs.nvidia.com/deploy/xid-errors/index.html).

The catalog's immediate bucket decides (``BUCKETS``; health maps each to one action):

- ``IGNORE`` ("No Action required"): informational, never unhealthy (``gpud.doctor.health``);
- ``RESTART_APP`` ("The application should be restarted; RESET_GPU or RESTART_BM is not deemed
  necessary"): the application's, not the node's;
- ``RESET_GPU``, ``RESTART_BM`` (restart bare metal): the GPU or the machine needs it now;
- ``CONTACT_SUPPORT``, ``CHECK_MECHANICALS`` (seating and connections): the hardware, inspected.

The catalog's other names are workflows over these; ``RESOLVED`` says how each is read and why (48:
WORKFLOW_XID_48, solo RESET_GPU; 154: the action its line names, taken as the strictest, a reboot; …).
Where the catalog publishes no bucket (162-172) the trigger text decides, else ``RESET_GPU``, as for an
Xid the catalog does not list. Where other tools differ (the Kubernetes device plugin treats 13, 31, 43,
45, 68, 109 as application Xids and every other as fatal), NVIDIA's bucket stands: docs/deployment.md,
"Xid policy", has the table. ``[health]`` overrides it (``gpud.doctor.health.policy_of``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Literal, NamedTuple, get_args

from gpud.hw.journald import JOURNAL_DIRS

if TYPE_CHECKING:
    from gpud.journal import Event

Bucket = Literal["IGNORE", "RESTART_APP", "RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT", "CHECK_MECHANICALS"]
BUCKETS: tuple[Bucket, ...] = get_args(Bucket)
# gpud's class of a bucket: what doctor's health.xid check and the exporter's gpud_xid_info show
KIND: dict[Bucket, str] = {"IGNORE": "informational", "RESTART_APP": "application", "RESET_GPU": "hardware",
                           "RESTART_BM": "hardware", "CONTACT_SUPPORT": "hardware", "CHECK_MECHANICALS": "hardware"}


class Xid(NamedTuple):
    kind: str  # hardware | application | informational | unknown
    meaning: str
    action: str  # what a person does (the remedy)
    bucket: Bucket = "RESET_GPU"  # the catalog's immediate action, resolved to one of BUCKETS
    catalog: str = ""  # the catalog's immediate and investigatory buckets as published ("" where blank)
    source: str = ""  # where ``bucket`` comes from


# (xid, mnemonic, description, immediate bucket, investigatory bucket) as published; "" where left blank
CATALOG = [
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", "CONTACT_SUPPORT"),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP",
     "CHECK_APP/CUDA"),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13"),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Fake or injected error from userspace", "IGNORE", "CONTACT_SUPPORT"),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP", "CHECK_APP/CUDA"),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", "WORKFLOW_XID_31"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP", "CHECK_APP/CUDA"),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE", "CHECK_APP/CUDA"),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE", "CONTACT_SUPPORT"),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", "CONTACT_SUPPORT"),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE",
     "CONTACT_SUPPORT"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45",
     "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", "CONTACT_SUPPORT"),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the GPU board",
     "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP", "INVESTIGATE_SW"),
    (61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU", "CONTACT_SUPPORT"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", "CONTACT_SUPPORT"),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE", "INVESTIGATE_SW"),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE", "CONTACT_SUPPORT"),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", "CHECK_APP/CUDA"),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", "UPDATE_SWFW"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", "CONTACT_SUPPORT"),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP", "CHECK_APP/CUDA"),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", "CONTACT_SUPPORT"),
    (87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE",
     "CONTACT_SUPPORT"),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", "IGNORE (sympathetic)"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", "IGNORE (sympathetic)"),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", "IGNORE"),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", "IGNORE"),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE", "XID_137_FLOW"),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", "INVESTIGATE_SW"),
    (111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW"),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU", "INVESTIGATE_SW"),
    (121, "C2C_ERROR", "C2C Error", "IGNORE", "CONTACT_SUPPORT"),
    (122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    *[(x, f"ROBUST_CHANNEL_CE{x - 116}_ERROR", f"CE{x - 116}: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT")
      for x in range(126, 136)],
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU", "INVESTIGATE_LINK_SI"),
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", "XID_137_FLOW"),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", "N/A; Unused"),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", "CONTACT_SUPPORT"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", "CONTACT_SUPPORT"),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", ""),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", "CONTACT_SUPPORT"),
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", "CONTACT_SUPPORT"),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", "CONTACT_SUPPORT"),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", "CONTACT_SUPPORT"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154",
     "N/A Informational only regarding another Xid"),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU", "INVESTIGATE_SW_USER"),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", "IGNORE"),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE", "CONTACT_SUPPORT"),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", "CONTACT_SUPPORT"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO"),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE", "INVESTIGATE_SW"),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", "INVESTIGATE_SW"),
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", ""),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", ""),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", ""),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", ""),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "CC traffic seen prior to link properly being configured for encrypted "
     "traffic", "", ""),
    (167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", "", ""),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", ""),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "", ""),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", ""),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Additional to Xid 48: the fault's particulars (DRAM)", "", ""),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Additional to Xid 48: the fault's particulars (SRAM)", "", ""),
]

UNUSED = "Unused"
# The catalog's workflow (and blank) immediate buckets, resolved to one of BUCKETS, with the reason.
_NO_BUCKET = "no bucket published and no action in the trigger text: RESET_GPU, as for an Xid not in the catalog"
RESOLVED: dict[int, tuple[Bucket, str]] = {
    45: ("IGNORE", "WORKFLOW_XID_45: not solo, IGNORE (follow the other Xid); solo, RESTART_FM (the NVSwitch "
                   "Fabric Manager, which a PCIe or NVLink-bridge workstation has not)"),
    48: ("RESET_GPU", "WORKFLOW_XID_48: solo, RESET_GPU; with Xid 63 or 64, DRAIN_AND_RESET"),
    74: ("RESET_GPU", "WORKFLOW_NVLINK_ERR: \"A GPU reset or node reboot is needed to clear this error\""),
    **{x: ("RESET_GPU", "WORKFLOW_NVLINK5_ERR: the catalog's Xid 144-150 decode gives IGNORE to RESET_GPU by "
                        "subcode; gpud does not decode it and takes the stricter") for x in range(144, 151)},
    78: ("RESTART_BM", "UPDATE_SWFW: update the driver and firmware, which takes a reboot"),
    151: ("RESTART_BM", "RESTART_VM: the VM owning the GPU is restarted (gpud's machine is that VM)"),
    154: ("RESTART_BM", "XID_154: follow the action the line names (None, Drain P2P, Drain and Reset, GPU Reset "
                        "Required, Node Reboot Required); gpud takes the strictest"),
    159: ("RESET_GPU", "CHECK_UVM: RESET_GPU if UVM is used, else IGNORE; CUDA programs use UVM (nvidia-uvm)"),
    162: ("IGNORE", "no bucket published; the capability is back: informational"),
    163: ("IGNORE", "no bucket published; trigger text: \"No GPU reset required\""),
    164: ("IGNORE", "no bucket published; trigger text: monitor power swings, expect to replace the GPU"),
    165: ("IGNORE", "no bucket published; trigger text: power smoothing is disabled, replace the GPU if power "
                   "swings are not acceptable"),
    166: ("RESET_GPU", _NO_BUCKET + " (confidential-computing mode only)"),
    167: ("RESET_GPU", _NO_BUCKET),
    168: ("RESTART_BM", "no bucket published; trigger text: enable ECC, or boot again with a shifted WPR"),
    169: ("RESET_GPU", "no bucket published; an internal micro-controller halt, as Xid 62 (RESET_GPU)"),
    170: ("RESET_GPU", _NO_BUCKET + " (confidential-computing mode only)"),
    171: ("RESET_GPU", "no bucket published; accompanies Xid 48 (WORKFLOW_XID_48: solo, RESET_GPU)"),
    172: ("RESET_GPU", "no bucket published; accompanies Xid 48 (WORKFLOW_XID_48: solo, RESET_GPU)"),
}

RESET = "drain the GPU and reset it (`sudo nvidia-smi -r -i N`) or reboot"
INSPECT = "inspect the hardware: the same hardware Xid came back after a reboot (`gpud events --dossier GPU`)"
SUPPORT = "if it recurs, contact the vendor's support with `gpud events --dossier N`"
REMEDY: dict[Bucket, str] = {
    "IGNORE": "no action required (NVIDIA's Xid catalog)",
    "RESTART_APP": "restart the program; a GPU reset or reboot is not needed (NVIDIA's Xid catalog)",
    "RESET_GPU": RESET,
    "RESTART_BM": "reboot the machine",
    "CONTACT_SUPPORT": "contact the vendor's support (NVIDIA's Xid catalog: CONTACT_SUPPORT) with "
                       "`gpud events --dossier N`",
    "CHECK_MECHANICALS": "check the board's seating and every connection to it",
}
# The investigatory buckets: what to do if it recurs.
FOLLOW_UP = {
    "CONTACT_SUPPORT": SUPPORT,
    "CHECK_APP/CUDA": "if it recurs, the program likely passes bad data to the GPU (the kernel line's pid names it)",
    "WORKFLOW_XID_13": "debug the program with compute-sanitizer or cuda-gdb; if it repeats on the same GPU with "
                       "other programs, test the GPU (`gpud burnin`)",
    "WORKFLOW_XID_31": "a program used a bad address: debug it with compute-sanitizer; if the faults repeat on the "
                       "same GPU with other programs, test the GPU (`gpud burnin`)",
    "INVESTIGATE_SW": "if it recurs, the program or NVIDIA's software is at fault (the kernel line's pid names "
                      "it): update the driver",
    "INVESTIGATE_SW_USER": "if unexpected, find the program or person that did it",
    "XID_137_FLOW": "an illegal NVLink peer access by a program: debug it with compute-sanitizer",
    "INVESTIGATE_LINK_SI": "check the link: reseat the NVLink bridge, read `nvidia-smi nvlink -e`",
    "UPDATE_SWFW": "update the driver and firmware",
}
# Remedies that say more than the bucket's, for the Xids a workstation meets.
SPECIFIC: dict[int, str] = {
    13: "usually a program bug (illegal access): rerun it under compute-sanitizer; if it recurs with other "
        "programs, test the GPU",
    31: "a program used a bad address: debug it with compute-sanitizer",
    32: "restart the program; if it recurs, check the PCIe link (`gpud doctor --check 'pcie.*'`), riser and seating",
    43: "nothing to do unless it recurs: the GPU remains healthy (NVIDIA's Xid catalog)",
    45: "informational: follows a crash or a kill; act on the Xid it follows",
    48: f"{RESET}; if it recurs, the board needs replacing (RMA)",
    54: "connect the board's power cables (8-pin / 12VHPWR) and check the supply",
    63: "nothing to do now (NVIDIA's Xid catalog: IGNORE); the remapping takes effect at the next GPU reset; "
        "watch for Xid 64",
    64: f"{RESET}; if it recurs, RMA the board",
    74: f"reseat the NVLink bridge; read `nvidia-smi nvlink -e`; {RESET}",
    79: "reboot; check power cables, seating, riser and slot, and the power supply",
    80: "restart the program; if it recurs, check the PCIe link, riser and seating",
    92: "no action now: single-bit errors are corrected (NVIDIA's Xid catalog: IGNORE); watch the ECC counts "
        f"(`nvidia-smi -q -d ECC`) for double-bit errors; {SUPPORT}",
    94: "restart the affected program (the others are unaffected); reset the GPU when convenient",
    95: f"every program on the GPU is affected: {RESET}",
    140: f"{RESET}; if it recurs, RMA the board",
    154: "do the recovery action the kernel log line names",
}
# The meaning gpud shows, where it says more than the catalog's description.
MEANING: dict[int, str] = {
    8: "GPU stopped processing (channel idle timeout)", 11: "invalid or corrupted push buffer stream",
    13: "graphics engine exception", 25: "invalid or illegal push buffer stream",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream (DMA controller fault: PCIe bus quality)",
    43: "GPU stopped processing after a program's fault",
    45: "preemptive clean-up after a program was killed or faulted",
    48: "double-bit ECC error (DBE)", 54: "auxiliary power is not connected to the GPU board",
    63: "ECC page retirement or row remapping recorded", 64: "ECC page retirement or row remapping failed",
    68: "video decoder (NVDEC) exception", 74: "NVLink error", 79: "GPU has fallen off the bus",
    80: "corrupted data sent to the GPU", 92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 109: "context switch timeout", 119: "GSP firmware RPC timeout",
    120: "GSP firmware error", 121: "C2C (chip-to-chip) link error (corrected)", 140: "unrecovered ECC error",
    154: "GPU recovery action changed (the driver asks for a reset, a reboot or a drain)",
}


def _entry(xid: int, mnemonic: str, description: str, immediate: str, investigatory: str) -> Xid:
    resolved = RESOLVED.get(xid)
    if resolved is not None:
        bucket, source = resolved
    else:
        bucket = immediate  # type: ignore[assignment]  # checked below
        source = f"NVIDIA's Xid catalog: {immediate}"
    if bucket not in BUCKETS:
        raise AssertionError(f"Xid {xid}: bucket {immediate!r} has no resolution")
    published = " / ".join(b for b in (immediate, investigatory) if b)
    if description == UNUSED:
        meaning = f"{mnemonic} (unused on Ampere and newer: deprecated, or Volta and older)"
        remedy = ("NVIDIA's Xid catalog lists it as Unused on Ampere and newer (CONTACT_SUPPORT): contact "
                  "the vendor's support with `gpud events --dossier N`")
        return Xid(KIND[bucket], meaning, remedy, bucket, published, source + " (Unused)")
    meaning = MEANING.get(xid, f"{description} ({mnemonic})")
    remedy = SPECIFIC.get(xid) or "; ".join(r for r in (REMEDY[bucket], FOLLOW_UP.get(investigatory, "")) if r)
    return Xid(KIND[bucket], meaning, remedy, bucket, published, source)


XIDS: dict[int, Xid] = {row[0]: _entry(*row) for row in CATALOG}
# IGNORE Xids that need no follow-up either (investigatory bucket IGNORE or none; 45's solo RESTART_FM needs an
# NVSwitch): healthy with a note. The other IGNORE ones name a follow-up "if the issue reoccurs": degraded.
QUIET = frozenset(row[0] for row in CATALOG if XIDS[row[0]].bucket == "IGNORE"
                  and (row[4] in ("", "IGNORE", "IGNORE (sympathetic)") or row[4].startswith("N/A") or row[0] == 45))


def escalated(xid: int, boots: int) -> Xid:
    """A hardware Xid seen on the same GPU in ``boots`` boots: from two on, a reset or reboot has not
    cured it, so the action is to inspect the hardware."""
    d = describe(xid)
    return d._replace(action=INSPECT) if d.kind == "hardware" and boots > 1 else d


def describe(xid: int) -> Xid:
    return XIDS.get(xid, Xid("unknown", f"Xid {xid}: not in NVIDIA's Xid catalog (1-172)",
                             "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); if it recurs, "
                             + RESET, "RESET_GPU", "", "not in the catalog: RESET_GPU (the device plugin treats an "
                             "Xid it does not list as fatal)"))


def unreadable_needs(tried: tuple[tuple[str, str], ...], root: bool) -> list[str]:
    """What gpud needs to read a kernel log, from each source tried and why it failed (``Host.read_xids``'s
    ``KernelLogUnreadable.tried``): /dev/kmsg refused needs root or CAP_SYSLOG (kernel.dmesg_restrict=1,
    Linux ``check_syslog_permissions``); absent, it was not mounted into the container. The journal
    (``gpud.hw.journald``) refused needs group systemd-journal, or adm where systemd-tmpfiles gave adm
    read by ACL (systemd's tmpfiles.d/systemd.conf: Debian and Ubuntu build it with adm, Fedora and RHEL
    with adm and wheel); it needs libsystemd, and this boot's kernel messages in the directories read. A
    syslog file refused needs read access (Debian's kern.log is 0640 syslog:adm, RHEL's messages 0600
    root). Nothing there at all is a journald-only node whose journal was not mounted."""

    why = dict(tried)
    needs = []
    kmsg = why.get("/dev/kmsg")
    journal = [(p, w) for p, w in tried if p in JOURNAL_DIRS]
    files = [(p, w) for p, w in tried if p != "/dev/kmsg" and p not in JOURNAL_DIRS]
    if kmsg == "permission denied":
        needs.append("grant CAP_SYSLOG (or `sudo sysctl kernel.dmesg_restrict=0`) to read /dev/kmsg"
                     if root else "run as root (or grant CAP_SYSLOG) to read /dev/kmsg")
    elif kmsg == "absent":
        needs.append("mount /dev/kmsg read-only into the container")

    def where(reason: str) -> str:
        return " and ".join(p for p, w in journal if w == reason)

    if where("permission denied"):
        needs.append(f"grant read access to the journal in {where('permission denied')}" if root else
                     f"join group systemd-journal, or adm where the journal's ACL grants it, to read "
                     f"{where('permission denied')}")
    if where("libsystemd not found"):
        needs.append(f"install libsystemd (libsystemd0, systemd-libs) to read {where('libsystemd not found')}")
    if where("no kernel messages of this boot"):
        absent = " and ".join(p for p, w in journal if w == "absent")
        needs.append(f"{where('no kernel messages of this boot')} has no kernel message of this boot"
                     + (f": mount {absent} (journald's volatile journal) too" if absent else
                        ": check journald's Storage= setting"))
    for p, w in journal:
        if w.startswith(("refused", "libsystemd:", "boot id")):
            needs.append(f"{p}: {w}" if not w.startswith("refused") else
                         f"make {p} root's and writable by root alone ({w})")
    denied = [p for p, w in files if w == "permission denied"]
    if denied:
        needs.append(f"grant read access to {' or '.join(denied)}" + ("" if root else " (run as root, or join "
                                                                                      "its group, e.g. adm)"))
    nothing = [w for _, w in journal + files]
    if files and all(w in ("absent", "no journal files") for w in nothing):
        needs.append("journald-only node: no /var/log/kern.log or /var/log/messages, and no journal: mount the "
                     "host's /var/log/journal and /run/log/journal read-only, readable by group systemd-journal "
                     "(or adm by the journal's ACL)")
    return needs or ["a readable /dev/kmsg"]


def unreadable_summary(tried: tuple[tuple[str, str], ...], root: bool) -> tuple[str, str]:
    """(summary, remedy) of the Xid check and health component when no kernel log could be read:
    "not judged", never "no Xids"."""
    listed = ", ".join(f"{p} {w}" for p, w in tried)
    needs = unreadable_needs(tried, root)
    summary = f"not judged: no kernel log readable ({listed}), Xids unknown; gpud needs: {'; '.join(needs)}"
    return summary, "; ".join(needs)


def repeated_hardware_xids(evs: Iterable[Event]) -> Iterator[tuple[str, int, int]]:
    """(uuid, xid, boots) for each hardware Xid seen on the same GPU in more than one boot."""
    boots: dict[tuple[str, int], set[str]] = {}
    for e in evs:
        xid = e.data.get("xid", 0)
        if e.kind == "xid" and e.uuid and e.boot_id and isinstance(xid, int) and not isinstance(xid, bool):
            boots.setdefault((e.uuid, xid), set()).add(e.boot_id)
    for (uuid, xid), seen in sorted(boots.items()):
        info = XIDS.get(xid)
        if len(seen) > 1 and info is not None and info.kind == "hardware":
            yield uuid, xid, len(seen)
