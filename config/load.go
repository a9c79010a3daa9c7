package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/netplane/netplane/apis/config/v1alpha1"
)

// Load builds the configuration from the parsed flag set fs (registered with
// AddFlags, whose table is passed in), the environment and the file named by
// --config or NETPLANE_CONFIG, then validates it.
func Load(fs *pflag.FlagSet, table []flag) (*v1alpha1.Configuration, error) {
	v := viper.New()
	for _, f := range table {
		if err := v.BindPFlag(f.key, fs.Lookup(f.name)); err != nil {
			return nil, err
		}
		if err := v.BindEnv(f.key, EnvName(f.name)); err != nil {
			return nil, err
		}
	}
	path, _ := fs.GetString(ConfigFlag)
	if !fs.Changed(ConfigFlag) {
		if env, ok := os.LookupEnv(EnvName(ConfigFlag)); ok {
			path = env
		}
	}
	if path != "" {
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
	err := v.Unmarshal(cfg, func(dc *mapstructure.DecoderConfig) {
		dc.TagName = "json"
		dc.Squash = true
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(durationHook, mapstructure.StringToSliceHookFunc(","))
	})
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	// An empty list from the environment or the file means "unset", as flags do.
	cfg.Roles = compact(cfg.Roles)
	cfg.DNS.Upstream = compact(cfg.DNS.Upstream)
	cfg.Node.ClusterCIDRs = compact(cfg.Node.ClusterCIDRs)
	cfg.Node.ServiceCIDRs = compact(cfg.Node.ServiceCIDRs)
	cfg.Node.NodePortAddresses = compact(cfg.Node.NodePortAddresses)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
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

// checkFile rejects what viper would silently ignore: unknown fields (named
// by their full path) and values of the wrong type.
func checkFile(data []byte) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	var tree any
	if err := json.Unmarshal(js, &tree); err != nil {
		return err
	}
	if tree == nil {
		return nil // an empty file sets nothing
	}
	if errs := unknownFields(tree, reflect.TypeOf(v1alpha1.Configuration{}), ""); len(errs) > 0 {
		return errors.Join(errs...)
	}
	var typed v1alpha1.Configuration
	if err := json.Unmarshal(js, &typed); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s: expected %s, got %s", te.Field, typeName(te.Type), te.Value)
		}
		return err
	}
	return nil
}

func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint32:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	}
	return t.String()
}

// unknownFields walks a decoded JSON tree beside the Go type it must fit and
// names every key the type does not have (and every malformed duration).
func unknownFields(tree any, t reflect.Type, path string) []error {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var errs []error
	switch node := tree.(type) {
	case string:
		// metav1.Duration's own decoder does not say which field it was.
		if t == durationType {
			if _, err := time.ParseDuration(node); err != nil {
				errs = append(errs, fmt.Errorf("%s: %q is not a duration like 30s", path, node))
			}
		}
	case map[string]any:
		if t.Kind() != reflect.Struct || t == durationType {
			return nil // a type error, reported by the typed decode
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(node))
		for k := range node {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			ft, ok := fields[k]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: unknown field", p))
				continue
			}
			errs = append(errs, unknownFields(node[k], ft, p)...)
		}
	case []any:
		if t.Kind() == reflect.Slice {
			for i, e := range node {
				errs = append(errs, unknownFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	}
	return errs
}

// jsonFields maps a struct's JSON names to field types, following inline embeds.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && strings.Contains(opts, "inline") {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
