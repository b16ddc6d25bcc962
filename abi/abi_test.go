package abi

import (
	"testing"
	"unsafe"
)

func TestNetPropertiesLayout(t *testing.T) {
	var p NetProperties
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof", unsafe.Sizeof(p), NetPropertiesSize},
		{"alignof", unsafe.Alignof(p), 8},
		{"pciPath", unsafe.Offsetof(p.PciPath), 8},
		{"guid", unsafe.Offsetof(p.GUID), 16},
		{"ptrSupport", unsafe.Offsetof(p.PtrSupport), 24},
		{"speed", unsafe.Offsetof(p.Speed), 36},
		{"latency", unsafe.Offsetof(p.Latency), 44},
		{"maxRecvs", unsafe.Offsetof(p.MaxRecvs), 52},
		{"netDeviceType", unsafe.Offsetof(p.NetDeviceType), 56},
		{"vProps", unsafe.Offsetof(p.VPropsNdevs), 64},
		{"maxP2pBytes", unsafe.Offsetof(p.MaxP2pBytes), 104},
		{"maxCollBytes", unsafe.Offsetof(p.MaxCollBytes), 112},
		{"maxMultiRequestSize", unsafe.Offsetof(p.MaxMultiRequestSize), 120},
		{"railId", unsafe.Offsetof(p.RailID), 124},
		{"planeId", unsafe.Offsetof(p.PlaneID), 126},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if s := unsafe.Sizeof(RmaConfig{}); s != RmaConfigSize {
		t.Errorf("sizeof RmaConfig = %d, want %d", s, RmaConfigSize)
	}
}

func TestFlavorLevels(t *testing.T) {
	if FlavorNCCL.Level(LogWarn) != 2 || FlavorRCCL.Level(LogWarn) != 3 {
		t.Fatal("WARN numbering")
	}
	if FlavorNCCL.Level(LogInfo) != 3 || FlavorRCCL.Level(LogInfo) != 4 {
		t.Fatal("INFO numbering")
	}
	if FlavorRCCL.Level(LogNone) != 0 {
		t.Fatal("NONE numbering")
	}
}

func TestResultString(t *testing.T) {
	if InvalidArgument.String() != "ncclInvalidArgument" || Result(42).String() != "ncclResult(42)" {
		t.Fatal(InvalidArgument.String())
	}
}
