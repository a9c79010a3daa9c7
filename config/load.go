package config

import (
	"bytes"
	"encoding"
	gojson "encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// Load builds the configuration from the parsed flag set fs (registered with
// AddFlags, whose table is passed in), the environment and the file named by
// --config or NETPLANE_CONFIG, then validates it. Every error names the
// field by its path in the file (dns.ttl, node.clusterCIDRs[1]).
func Load(fs *pflag.FlagSet, table []flag) (*v1alpha1.Configuration, error) {
	v := newViper()
	for _, f := range table {
		key := strings.ReplaceAll(f.key, ".", keyDelimiter)
		if err := v.BindPFlag(key, fs.Lookup(f.name)); err != nil {
			return nil, err
		}
		if err := v.BindEnv(key, EnvName(f.name)); err != nil {
			return nil, err
		}
	}
	if path := File(fs); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		if err := checkFile(data); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		v.SetConfigType("yaml")
		if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
	}
	cfg := v1alpha1.Default()
	errs := decode(v, cfg)
	// An empty list from the environment or the file means "unset", as flags do.
	cfg.Roles = compact(cfg.Roles)
	cfg.DNS.UpstreamServers = compact(cfg.DNS.UpstreamServers)
	for d, servers := range cfg.DNS.StubDomains {
		cfg.DNS.StubDomains[d] = compact(servers)
	}
	cfg.Node.NodePortAddresses = compact(cfg.Node.NodePortAddresses)
	// A CIDR is its network, as net.ParseCIDR (and so kube-proxy) reads
	// 10.244.1.0/16: the rules are built from prefixes compared as such.
	for _, list := range [][]netip.Prefix{cfg.Node.ClusterCIDRs, cfg.Node.ServiceCIDRs} {
		for i := range list {
			list[i] = list[i].Masked()
		}
	}
	// Every field is validated, also when another did not decode; a field
	// that did not decode is reported once.
	if err := v1alpha1.ErrorOf(merge(errs, cfg.Validate())); err != nil {
		return nil, err
	}
	return cfg, nil
}

// File is the configuration file Load reads: --config, else
// NETPLANE_CONFIG; "" for none.
func File(fs *pflag.FlagSet) string {
	path, _ := fs.GetString(ConfigFlag)
	if !fs.Changed(ConfigFlag) {
		if env, ok := os.LookupEnv(EnvName(ConfigFlag)); ok {
			path = env
		}
	}
	return path
}

// keyDelimiter separates the levels of a key inside viper. Viper's own
// "." would split a stub domain (dns.stubDomains: {corp.example: [...]})
// into nested keys.
const keyDelimiter = "::"

func newViper() *viper.Viper { return viper.NewWithOptions(viper.KeyDelimiter(keyDelimiter)) }

// merge appends to errs those of more whose field errs does not name yet.
func merge(errs, more field.ErrorList) field.ErrorList {
	for _, e := range more {
		if !slices.ContainsFunc(errs, func(o *field.Error) bool { return o.Field == e.Field }) {
			errs = append(errs, e)
		}
	}
	return errs
}

// checkFile refuses what viper would take silently: unknown or repeated
// fields and values of the wrong type (sigs.k8s.io/json's strict decoding,
// which gives each its full path), and values their own type does not
// parse (a duration, a CIDR), decoded as the layers are.
//
// The strict decoder reports unknown fields only when every value decoded,
// and it stops at a value its type's parser refuses without saying where;
// the second decode reports such a value with its path. So a file with a
// bad value shows its unknown fields once the value is fixed.
func checkFile(data []byte) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	var errs field.ErrorList
	strict, unplaced := json.UnmarshalStrict(js, &v1alpha1.Configuration{})
	for _, e := range strict {
		var fe json.FieldError
		if errors.As(e, &fe) {
			what := strings.TrimSuffix(fe.Error(), " "+strconv.Quote(fe.FieldPath())) // "unknown field"
			errs = append(errs, &field.Error{Type: field.ErrorTypeForbidden, Field: fe.FieldPath(), Detail: what})
		}
	}
	var te *gojson.UnmarshalTypeError
	if errors.As(unplaced, &te) {
		errs = append(errs, field.TypeInvalid(field.NewPath(te.Field), field.OmitValueType{}, fmt.Sprintf("expected %s, got %s", te.Type, te.Value)))
		unplaced = nil
	}
	v := newViper()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		return err
	}
	errs = merge(errs, decode(v, v1alpha1.Default()))
	if len(errs) > 0 {
		return v1alpha1.ErrorOf(errs)
	}
	return unplaced
}

// decode fills cfg from v's settings with mapstructure, which names the
// path of every value it cannot take.
func decode(v *viper.Viper, cfg *v1alpha1.Configuration) field.ErrorList {
	err := v.Unmarshal(cfg, func(dc *mapstructure.DecoderConfig) {
		dc.TagName = "json"
		dc.Squash = true
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(durationHook, mapstructure.StringToWeakSliceHookFunc(","),
			trimText, mapstructure.TextUnmarshallerHookFunc())
	})
	var errs field.ErrorList
	var walk func(error)
	walk = func(err error) {
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range joined.Unwrap() {
				walk(e)
			}
			return
		}
		if de, ok := err.(*mapstructure.DecodeError); ok {
			if _, nested := de.Unwrap().(interface{ Unwrap() []error }); !nested {
				errs = append(errs, field.Invalid(field.NewPath(de.Name()), field.OmitValueType{}, de.Unwrap().Error()))
				return
			}
		}
		if inner := errors.Unwrap(err); inner != nil {
			walk(inner) // a DecodeError around several, or "decoding failed due to the following error(s)"
			return
		}
		errs = append(errs, &field.Error{Type: field.ErrorTypeInternal, Detail: err.Error()})
	}
	if err != nil {
		walk(err)
	}
	return errs
}

func compact(list []string) []string {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// trimText drops the blanks around a value that parses itself (a CIDR in
// "10.244.0.0/16, fd00:10:244::/56").
func trimText(from, to reflect.Type, data any) (any, error) {
	if s, ok := data.(string); ok && reflect.PointerTo(to).Implements(textUnmarshaler) {
		return strings.TrimSpace(s), nil
	}
	return data, nil
}

var durationType = reflect.TypeOf(metav1.Duration{})

// durationHook turns "30s" (file, environment) and time.Duration (flags)
// into metav1.Duration.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch d := data.(type) {
	case time.Duration:
		return metav1.Duration{Duration: d}, nil
	case string:
		parsed, err := time.ParseDuration(d)
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration like 30s", d)
		}
		return metav1.Duration{Duration: parsed}, nil
	}
	return data, nil
}
