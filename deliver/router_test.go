package deliver

import (
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/levels"
)

// TestRouterConfigFields checks that RouterConfig.routing copies every
// field of RouterConfig but OnRouted (the router's Tails): RouterConfig
// and routing.Config have the same fields otherwise, with the same types,
// and each is carried over.
func TestRouterConfigFields(t *testing.T) {
	fields := func(typ reflect.Type) map[string]reflect.Type {
		m := make(map[string]reflect.Type, typ.NumField())
		for i := range typ.NumField() {
			m[typ.Field(i).Name] = typ.Field(i).Type
		}
		return m
	}
	want := fields(reflect.TypeFor[RouterConfig]())
	delete(want, "OnRouted")
	if got := fields(reflect.TypeFor[routing.Config]()); !reflect.DeepEqual(got, want) {
		t.Fatalf("routing.Config has fields %v; want RouterConfig's but OnRouted, %v", got, want)
	}
	cfg := RouterConfig{
		Prefix: "p", Levels: levels.MustParse("1s 10s"), Targets: contract.TargetPolicy{Allow: []string{"a.>"}},
		Partitions: levels.Partitions{}.WithIngress(2), IngressPartition: 1, MaxDelay: time.Hour, Replicas: 3,
		Logger: slog.Default(), MaxInFlight: 7, Batch: 9, OnRouted: func(string, uint64) {},
	}
	src, dst := reflect.ValueOf(cfg), reflect.ValueOf(cfg.routing())
	for i := range dst.NumField() {
		name := dst.Type().Field(i).Name
		if f := src.FieldByName(name); f.IsZero() || !reflect.DeepEqual(f.Interface(), dst.Field(i).Interface()) {
			t.Errorf("routing().%s = %v; want RouterConfig's %v (set in this test)", name, dst.Field(i), f)
		}
	}
}
