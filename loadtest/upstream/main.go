// upstream-allocator: the claims of `python -m loadtest.bench solver` placed by Kubernetes' own
// structured allocator (k8s.io/dynamic-resource-allocation/structured, the library
// kube-scheduler's DynamicResources plugin calls), on the same ResourceSlices, for comparison.
//
//	upstream-allocator DIR > result.json
//
// DIR holds what loadtest/upstream_allocator.py writes: slices.json, nodes.json, classes.json
// (lists of resource.k8s.io/v1 and v1 objects), allocated.json (the devices held:
// [[driver, pool, device], ...]) and claims.json ({kind: {"claims": [ResourceClaim...],
// "node": the node gpualloc placed them on, "repeat": N}}).
//
// Upstream has no fleet-wide search: the scheduler builds an allocator per pod (PreFilter) and
// asks it node by node (Filter). Per kind this measures, on the initial state:
//   - pinned: Allocate on gpualloc's node alone (one Filter call), N times;
//   - all nodes: NewAllocator, then Allocate on every node in order (Filter on the whole fleet,
//     one goroutine), fewer times at larger sizes; it counts the feasible nodes;
//   - first fit: the same until the first node that fits.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type kindInput struct {
	Claims []*resourceapi.ResourceClaim `json:"claims"`
	Node   string                       `json:"node"`
	Repeat int                          `json:"repeat"`
	Fleet  int                          `json:"fleet_repeat"`
}

type kindResult struct {
	PinnedMs       []float64 `json:"pinned_ms"`
	PinnedFits     bool      `json:"pinned_fits"`
	PinnedDevices  []string  `json:"pinned_devices"`
	NewAllocatorMs []float64 `json:"new_allocator_ms"`
	AllNodesMs     []float64 `json:"all_nodes_ms"`
	FeasibleNodes  int       `json:"feasible_nodes"`
	FirstFitMs     []float64 `json:"first_fit_ms"`
	FirstFitNode   string    `json:"first_fit_node"`
	Nodes          int       `json:"nodes"`
	Error          string    `json:"error,omitempty"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

func read(dir, name string, into any) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		fail(err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		fail(fmt.Errorf("%s: %w", name, err))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "upstream-allocator:", err)
	os.Exit(1)
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func main() {
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: upstream-allocator DIR"))
	}
	dir := os.Args[1]
	var slices []*resourceapi.ResourceSlice
	var nodes []*v1.Node
	var classList []*resourceapi.DeviceClass
	var allocated [][3]string
	var kinds map[string]kindInput
	read(dir, "slices.json", &slices)
	read(dir, "nodes.json", &nodes)
	read(dir, "classes.json", &classList)
	read(dir, "allocated.json", &allocated)
	read(dir, "claims.json", &kinds)
	lister := classes{}
	for _, class := range classList {
		lister[class.Name] = class
	}
	held := sets.New[structured.DeviceID]()
	for _, id := range allocated {
		held.Insert(structured.MakeDeviceID(id[0], id[1], id[2]))
	}
	byName := map[string]*v1.Node{}
	for _, node := range nodes {
		byName[node.Name] = node
	}
	// kube-scheduler 1.34's defaults: prioritized lists (beta) on; partitionable devices
	// (alpha) on too, or the MIG nodes' counter-consuming devices could not be allocated.
	features := structured.Features{PrioritizedList: true, PartitionableDevices: true}
	state := structured.AllocatedState{AllocatedDevices: held}
	ctx := context.Background()

	names := make([]string, 0, len(kinds))
	for name := range kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	results := map[string]*kindResult{}
	for _, name := range names {
		input := kinds[name]
		result := &kindResult{Nodes: len(nodes)}
		results[name] = result
		cache := cel.NewCache(10, cel.Features{})
		newAllocator := func() structured.Allocator {
			started := time.Now()
			allocator, err := structured.NewAllocator(ctx, features, state, lister, slices, cache)
			if err != nil {
				fail(err)
			}
			result.NewAllocatorMs = append(result.NewAllocatorMs, ms(time.Since(started)))
			return allocator
		}
		allocator := newAllocator()
		if node := byName[input.Node]; node != nil {
			for i := 0; i < input.Repeat; i++ {
				started := time.Now()
				found, err := allocator.Allocate(ctx, node, input.Claims)
				result.PinnedMs = append(result.PinnedMs, ms(time.Since(started)))
				if err != nil {
					result.Error = err.Error()
					break
				}
				result.PinnedFits = found != nil
				if i == 0 && found != nil {
					for _, allocation := range found {
						for _, r := range allocation.Devices.Results {
							result.PinnedDevices = append(result.PinnedDevices, r.Pool+"/"+r.Device)
						}
					}
				}
			}
		}
		for i := 0; i < input.Fleet && result.Error == ""; i++ {
			started := time.Now()
			allocator := newAllocator()
			feasible, firstFit := 0, time.Duration(0)
			for _, node := range nodes {
				found, err := allocator.Allocate(ctx, node, input.Claims)
				if err != nil {
					result.Error = err.Error()
					break
				}
				if found != nil {
					if feasible == 0 {
						firstFit = time.Since(started)
						result.FirstFitNode = node.Name
					}
					feasible++
				}
			}
			result.AllNodesMs = append(result.AllNodesMs, ms(time.Since(started)))
			if feasible > 0 {
				result.FirstFitMs = append(result.FirstFitMs, ms(firstFit))
			}
			result.FeasibleNodes = feasible
		}
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", " ")
	if err := out.Encode(results); err != nil {
		fail(err)
	}
}
