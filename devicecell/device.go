// SPDX-License-Identifier: Apache-2.0

package devicecell

import (
	"net"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// TableName is the name of the `devices` table.
const TableName = "devices"

// Device is a row of the `devices` table: a network device of the agent's
// network namespace.
type Device struct {
	// Index is the kernel's ifindex: a device deleted and created again
	// under the same name has a new one.
	Index int    `json:"index" yaml:"index"`
	Name  string `json:"name" yaml:"name"`
	// Kind is the link type netlink reports ("veth", "device", "vlan", ...).
	Kind string `json:"kind" yaml:"kind"`
	// Ethernet is set for a device of Ethernet framing (ARPHRD_ETHER),
	// the only framing the enforcement program reads.
	Ethernet     bool             `json:"ethernet" yaml:"ethernet"`
	Up           bool             `json:"up" yaml:"up"`
	HardwareAddr net.HardwareAddr `json:"hardwareAddr,omitempty" yaml:"hardwareAddr,omitempty"`
}

// TableHeader implements statedb.TableWritable.
func (*Device) TableHeader() []string {
	return []string{"Name", "Index", "Kind", "Ethernet", "Up", "HardwareAddr"}
}

// TableRow implements statedb.TableWritable.
func (d *Device) TableRow() []string {
	return []string{d.Name, strconv.Itoa(d.Index), d.Kind, strconv.FormatBool(d.Ethernet),
		strconv.FormatBool(d.Up), d.HardwareAddr.String()}
}

// IndexIndex is the primary index of `devices`: the ifindex.
var IndexIndex = statedb.Index[*Device, int]{
	Name: "index",
	FromObject: func(d *Device) index.KeySet {
		return index.NewKeySet(index.Int(d.Index))
	},
	FromKey:    index.Int,
	FromString: index.IntString,
	Unique:     true,
}

// NameIndex finds a device by name. Names are unique in a namespace at
// any moment: the controller removes the row of a name's previous device
// before it inserts the new one.
var NameIndex = statedb.Index[*Device, string]{
	Name: "name",
	FromObject: func(d *Device) index.KeySet {
		return index.NewKeySet(index.String(d.Name))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// NewTable creates and registers the `devices` table.
//
// Possible errors: those of statedb.NewTable (a table of that name is
// already registered).
func NewTable(db *statedb.DB) (statedb.RWTable[*Device], error) {
	return statedb.NewTable(db, TableName, IndexIndex, NameIndex)
}

var _ statedb.TableWritable = &Device{}
