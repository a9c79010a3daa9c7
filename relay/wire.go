package relay

import (
	"encoding/binary"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// Digest is what a node role reads of a pod (policy.PodFromAPI): its name,
// namespace, labels, node, host networking, named ports, phase and
// addresses. Everything else (conditions, container statuses, most of the
// spec) changes often and matters to no node's rules; leaving it out is
// what lets the relay send nothing for most status updates.
func Digest(p *v1.Pod) *v1.Pod {
	d := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, ResourceVersion: p.ResourceVersion, Labels: p.Labels},
		Spec:       v1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status:     v1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	d.Spec.Containers = namedPorts(p.Spec.Containers, false)
	d.Spec.InitContainers = namedPorts(p.Spec.InitContainers, true)
	return d
}

// namedPorts keeps of each container its named ports; of init containers
// only sidecars (restartable), which serve like containers.
func namedPorts(cs []v1.Container, sidecars bool) []v1.Container {
	var out []v1.Container
	for _, c := range cs {
		if sidecars && (c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways) {
			continue
		}
		var ports []v1.ContainerPort
		for _, p := range c.Ports {
			if p.Name != "" {
				ports = append(ports, v1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
			}
		}
		if len(ports) > 0 {
			out = append(out, v1.Container{Name: c.Name, Ports: ports, RestartPolicy: c.RestartPolicy})
		}
	}
	return out
}

func mustMarshal(m interface{ Marshal() ([]byte, error) }) []byte {
	b, err := m.Marshal()
	if err != nil {
		panic(err) // generated marshallers of API types fail on nothing
	}
	return b
}

// The Kubernetes protobuf encoding (k8s.io/apimachinery's protobuf
// serializer): a magic prefix, then a runtime.Unknown naming the type
// around the object's own bytes.
var protoPrefix = []byte{0x6b, 0x38, 0x73, 0x00}

const (
	protobufType      = "application/vnd.kubernetes.protobuf"
	protobufWatchType = "application/vnd.kubernetes.protobuf;stream=watch"
)

func envelope(kind string, raw []byte) []byte {
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "v1", Kind: kind}, Raw: raw}
	return append(append([]byte(nil), protoPrefix...), mustMarshal(&u)...)
}

// listBody is a PodList of items (each a Pod's own bytes), without
// decoding them.
func listBody(items [][]byte, rv uint64, next string) []byte {
	l := v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: versionString(rv), Continue: next}}
	b := mustMarshal(&l)
	for _, it := range items {
		b = protowire.AppendTag(b, 2, protowire.BytesType) // PodList.items
		b = protowire.AppendBytes(b, it)
	}
	return envelope("PodList", b)
}

// frame is one watch event as the API server frames it: a 4-byte
// big-endian length, then a WatchEvent whose object is enveloped.
func frame(t watch.EventType, obj interface{ Marshal() ([]byte, error) }) []byte {
	e := metav1.WatchEvent{Type: string(t), Object: runtime.RawExtension{Raw: envelope(kindOf(obj), mustMarshal(obj))}}
	b := mustMarshal(&e)
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b))), b...) //nolint:gosec // far below 4 GB
}

func kindOf(obj any) string {
	if _, ok := obj.(*metav1.Status); ok {
		return "Status"
	}
	return "Pod"
}

// bookmarkFrame tells a watcher the store's version.
func bookmarkFrame(rv uint64) []byte {
	return frame(watch.Bookmark, &v1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: versionString(rv)}})
}

// goneFrame ends a watch whose version the relay cannot resume from: the
// reflector lists again, as after the API server's own "too old resource
// version".
func goneFrame(msg string) []byte {
	return frame(watch.Error, gone(msg))
}

func gone(msg string) *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: msg}
}

func versionString(rv uint64) string {
	if rv == 0 {
		return ""
	}
	return strconv.FormatUint(rv, 10)
}
