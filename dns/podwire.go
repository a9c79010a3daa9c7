package dns

import (
	"bytes"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/netplane/netplane/internal/intern"
)

// The pods' wire reader: the pods' view needs of a pod its namespace,
// name, version, phase and addresses, a few dozen bytes of a Pod that is
// kilobytes of spec and status. Decoding each listed or watched pod into
// a corev1.Pod allocated about 16 kB a pod, most of a relist's garbage,
// and ran the Pod's generated decoders, whose code the relist faulted in.
// Here the protobuf the API server sends is read field by field and only
// those fields are kept: a Pod or PodList arrives as a podInfo or a
// podInfoList. Anything else (a Status of an error, a watch's frames) is
// decoded as client-go's own codecs do.

// The field numbers of the messages read, from k8s.io/api's and
// k8s.io/apimachinery's generated.proto.
const (
	unknownTypeMeta, unknownRaw = 1, 2 // runtime.Unknown
	typeMetaKind                = 2    // runtime.TypeMeta
	listMeta, listItems         = 1, 2 // PodList
	listVersion, listContinue   = 2, 3 // ListMeta
	listRemaining               = 4
	podMeta, podStatus          = 1, 3 // Pod
	metaName, metaNamespace     = 1, 3 // ObjectMeta
	metaVersion, metaAnnots     = 6, 12
	statusPhase, statusPodIP    = 1, 6 // PodStatus
	statusPodIPs, podIPAddress  = 12, 1
	mapKey, mapValue            = 1, 2 // a map entry
)

// protobufMagic begins every object the API server encodes as protobuf.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

var errNotPods = errors.New("not a Pod or PodList")

// decodePodWire decodes an object as the API server encodes it: a Pod into
// a podInfo, a PodList into a podInfoList; errNotPods for another kind.
func decodePodWire(data []byte) (runtime.Object, error) {
	if !bytes.HasPrefix(data, protobufMagic) {
		return nil, errors.New("not a protobuf object")
	}
	var kind string
	var raw []byte
	err := eachField(data[len(protobufMagic):], func(num protowire.Number, v []byte) error {
		switch num {
		case unknownTypeMeta:
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num == typeMetaKind {
					kind = string(v)
				}
				return nil
			})
		case unknownRaw:
			raw = v
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case kind == "Pod":
		return decodePod(raw)
	case kind == "PodList":
		return decodePodList(raw)
	}
	return nil, errNotPods
}

func decodePodList(data []byte) (*podInfoList, error) {
	l := &podInfoList{}
	err := eachField(data, func(num protowire.Number, v []byte) error {
		switch num {
		case listMeta:
			return eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case listVersion:
					l.ResourceVersion = string(v)
				case listContinue:
					l.Continue = string(v)
				}
				return nil
			})
		case listItems:
			p, err := decodePod(v)
			if err != nil {
				return err
			}
			l.Items = append(l.Items, p)
		}
		return nil
	})
	return l, err
}

func decodePod(data []byte) (*podInfo, error) {
	p := &podInfo{}
	var st podStatusFields
	err := eachField(data, func(num protowire.Number, v []byte) error {
		switch num {
		case podMeta:
			return eachField(v, p.readMeta)
		case podStatus:
			return eachField(v, st.read)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if p.name == "" && p.rv == "" {
		return nil, errors.New("a Pod without a name or version")
	}
	p.addrs = pack(statusAddrs(corev1.PodPhase(st.phase), st.podIP, st.podIPs))
	return p, nil
}

// readMeta reads a field of the pod's ObjectMeta.
func (p *podInfo) readMeta(num protowire.Number, v []byte) error {
	switch num {
	case metaName:
		p.name = string(v)
	case metaNamespace:
		p.ns = intern.Bytes(v)
	case metaVersion:
		p.rv = string(v)
	case metaAnnots: // one map entry: only the key says a bookmark
		return eachField(v, func(num protowire.Number, v []byte) error {
			if num == mapKey && string(v) == metav1.InitialEventsAnnotationKey {
				p.initialEventsEnd = true
			}
			return nil
		})
	}
	return nil
}

// podStatusFields are the fields of a PodStatus the addresses come from.
type podStatusFields struct {
	phase, podIP string
	podIPs       []string
}

func (st *podStatusFields) read(num protowire.Number, v []byte) error {
	switch num {
	case statusPhase:
		st.phase = string(v)
	case statusPodIP:
		st.podIP = string(v)
	case statusPodIPs:
		return eachField(v, func(num protowire.Number, v []byte) error {
			if num == podIPAddress {
				st.podIPs = append(st.podIPs, string(v))
			}
			return nil
		})
	}
	return nil
}

// eachField hands f each length-delimited field of a message and skips
// the others; a truncated or malformed message is an error.
func eachField(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("a malformed Pod: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("a malformed Pod: %w", protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("a malformed Pod: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, v); err != nil {
			return err
		}
	}
	return nil
}

// podInfoList is a page of pods as the wire reader makes it.
type podInfoList struct {
	metav1.ListMeta
	Items []*podInfo
}

func (l *podInfoList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *podInfoList) DeepCopyObject() runtime.Object {
	c := *l
	c.Items = append([]*podInfo(nil), l.Items...)
	return &c
}
